//! The command line of `bench-decode`, shaped like llama-bench's.

use clap::{Parser, ValueEnum};
use decode::device::DeviceRequest;
use std::path::PathBuf;

/// How results are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Markdown tables (speed, then memory).
    Md,
    /// One JSON array of test objects.
    Json,
    /// One header line, then a line per test.
    Csv,
}

fn at_least(min: usize, what: &str, s: &str) -> Result<usize, String> {
    let n: usize = s
        .parse()
        .map_err(|_| format!("'{s}' is not a whole number"))?;
    if n < min {
        Err(format!("{what} must be at least {min}, got {n}"))
    } else {
        Ok(n)
    }
}

fn repetitions(s: &str) -> Result<usize, String> {
    at_least(1, "the repetition count", s)
}

fn threads(s: &str) -> Result<usize, String> {
    at_least(1, "the thread count", s)
}

fn trace_capacity(s: &str) -> Result<usize, String> {
    at_least(1, "--alloc-trace-capacity", s)
}

fn batch_size(s: &str) -> Result<usize, String> {
    at_least(1, "a batch size B of --npl", s)
}

fn npp(s: &str) -> Result<usize, String> {
    // A sequence's first token is drawn from its prompt's last row.
    at_least(1, "--npp (every sequence needs a prompt)", s)
}

fn ntg(s: &str) -> Result<usize, String> {
    at_least(1, "--ntg (S_TG needs a decode step)", s)
}

fn rounds(s: &str) -> Result<usize, String> {
    // One round has no spread, so the noise rule would have nothing to stand on.
    at_least(2, "--rounds (a spread needs two samples per arm)", s)
}

#[derive(Parser, Debug, Clone)]
#[command(
    name = "bench-decode",
    about = "Prompt-processing and token-generation speed of GGUF models, with memory per phase",
    // Later occurrences replace earlier ones, so an --ab arm can override a measurement flag
    // the driver passes on (e.g. `--threads 4` in one arm).
    args_override_self = true,
    group(clap::ArgGroup::new("compare").args(["ab", "sweep"]).multiple(false))
)]
pub struct Args {
    /// A GGUF model file (repeat for several models).
    #[arg(short = 'm', long = "model", value_name = "FILE", required = true)]
    pub models: Vec<PathBuf>,
    /// Prompt tokens of the pp tests, comma-separated (0 skips it).
    #[arg(
        short = 'p',
        long = "n-prompt",
        visible_alias = "pp",
        value_name = "N[,N...]",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Generated tokens of the tg tests, comma-separated (0 skips it).
    #[arg(
        short = 'n',
        long = "n-gen",
        visible_alias = "tg",
        value_name = "N[,N...]",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Tokens of context before each test, comma-separated, prefilled untimed each repetition
    /// (llama-bench's -d): every pp and tg test runs at each depth.
    #[arg(
        short = 'd',
        long = "n-depth",
        value_name = "N[,N...]",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub n_depth: Vec<usize>,
    /// Positions the model's KV cache holds (its context); default and minimum -d + -p + -n + 1.
    /// A 32k context with -p 512 measures the speed and memory of a model sized for 32k.
    #[arg(long = "ctx", value_name = "N")]
    pub ctx: Option<usize>,
    /// Measured repetitions of each test.
    #[arg(short = 'r', long = "repetitions", visible_alias = "runs", value_name = "N", default_value_t = 5, value_parser = repetitions)]
    pub repetitions: usize,
    /// Unmeasured runs of each test first.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub warmup: usize,
    /// auto, cpu or gpu (auto picks the GPU when one is usable).
    #[arg(long, default_value = "auto")]
    pub device: DeviceRequest,
    /// GPU: run decode steps eagerly instead of replaying a captured graph.
    #[arg(long)]
    pub no_graph: bool,
    /// CPU threads (default: one per core; `-t` as in llama-bench).
    #[arg(short = 't', long, value_name = "N", value_parser = threads)]
    pub threads: Option<usize>,
    /// CPU: f32 activations (the reference path) instead of 16-bit integer ones.
    #[arg(long)]
    pub exact: bool,
    /// The KV cache's key type: f32, f16 or q8_0 (also `-ctk`, as llama-bench spells it);
    /// default f16 on the GPU, f32 on the CPU.
    #[arg(long = "cache-type-k", value_name = "TYPE")]
    pub cache_type_k: Option<decode::kv::KvType>,
    /// The KV cache's value type (also `-ctv`); keys and values share one type, so one flag
    /// sets both.
    #[arg(long = "cache-type-v", value_name = "TYPE")]
    pub cache_type_v: Option<decode::kv::KvType>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Md)]
    pub output: Format,
    /// The same as `-o json` (kept for older scripts).
    #[arg(long, hide = true)]
    pub json: bool,
    /// Compare two arms, each a string of KEY=VALUE environment assignments and --flags
    /// ('' is the baseline), in alternating child processes.
    #[arg(long, num_args = 2, value_names = ["ARM_A", "ARM_B"], allow_hyphen_values = true)]
    pub ab: Option<Vec<String>>,
    /// Rounds of an --ab comparison or a --sweep (each runs every arm once).
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = rounds, requires = "compare")]
    pub rounds: usize,
    /// Run every memory knob's arms against the defaults, per model, in alternating child
    /// processes (docs/bench-decode.md lists the arms).
    #[arg(long, conflicts_with_all = ["svg", "alloc_trace"])]
    pub sweep: bool,
    /// Only these knobs' arms in --sweep (comma-separated: cache, memory, graph-pool,
    /// capture-stream, trim-window); all by default.
    #[arg(long, value_name = "LIST", value_delimiter = ',', requires = "sweep")]
    pub sweep_knobs: Vec<String>,
    /// Write a memory timeline (bytes per tag over time) to this SVG file.
    #[arg(long, value_name = "FILE", conflicts_with = "ab")]
    pub svg: Option<PathBuf>,
    /// GPU only: record every allocation and free of the run's allocator and write them to
    /// this file, for `cargo xtask replay FILE --profile gfx1151`.
    #[arg(long, value_name = "FILE", conflicts_with = "ab")]
    pub alloc_trace: Option<PathBuf>,
    /// GPU: run under this GPU budget (bytes, "6.5GiB", "75%"), as `hipdecode run
    /// --gpu-budget`: the offload plan places the weights and the allocator's limit enforces
    /// the cap. Default: HIPDECODE_GPU_BUDGET; unset, no budget.
    #[arg(long, value_name = "BYTES")]
    pub gpu_budget: Option<String>,
    /// GPU: the most pinned host memory offloaded weights may take. Default:
    /// HIPDECODE_HOST_BUDGET, else 90% of the host's available memory.
    #[arg(long, value_name = "BYTES")]
    pub host_budget: Option<String>,
    /// Batched mode, like llama-batched-bench's -npl: for each batch size B (comma-separated),
    /// B sequences of --npp prompt tokens each are prefilled, then --ntg decode steps of B
    /// rows run. Replaces the pp/tg tests.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        value_parser = batch_size,
        conflicts_with_all = ["sweep", "svg", "alloc_trace", "gpu_budget", "host_budget", "n_prompt", "n_gen", "ctx"]
    )]
    pub npl: Vec<usize>,
    /// Batched mode: prompt tokens of each sequence (llama-batched-bench's -npp).
    #[arg(long, value_name = "N", default_value_t = 128, value_parser = npp, requires = "npl")]
    pub npp: usize,
    /// Batched mode: decode steps after the prompts (llama-batched-bench's -ntg).
    #[arg(long, value_name = "N", default_value_t = 128, value_parser = ntg, requires = "npl")]
    pub ntg: usize,
    /// Events the --alloc-trace ring keeps; a run with more writes a file marked incomplete.
    #[arg(long, value_name = "N", default_value_t = crate::alloc_trace::DEFAULT_CAPACITY, value_parser = trace_capacity, requires = "alloc_trace")]
    pub alloc_trace_capacity: usize,
}

/// A comma-separated list, as the list flags take it.
fn list(values: &[usize]) -> String {
    values
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl Args {
    /// Checks what clap cannot express; the message is for the user.
    pub fn validate(&self) -> Result<(), String> {
        if self.n_prompt.iter().chain(&self.n_gen).all(|&n| n == 0) {
            return Err("-p 0 and -n 0 leave nothing to measure".into());
        }
        let most = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
        let needed = most(&self.n_depth) + most(&self.n_prompt) + most(&self.n_gen) + 1;
        if let Some(ctx) = self.ctx.filter(|&c| c < needed) {
            return Err(format!(
                "--ctx {ctx} holds fewer positions than -d {} -p {} -n {} need ({needed}); \
                 give --ctx {needed} or more, or leave it out",
                most(&self.n_depth),
                most(&self.n_prompt),
                most(&self.n_gen)
            ));
        }
        if self.alloc_trace.is_some() && self.models.len() > 1 {
            return Err(format!(
                "--alloc-trace records one model's run, but {} models were given; pass one -m",
                self.models.len()
            ));
        }
        Ok(())
    }

    /// Checks the files the run will write (`--svg`, `--alloc-trace`) before anything is
    /// measured: each must name a file in a folder that exists, so a typo fails at once rather
    /// than after the whole benchmark.
    pub fn check_outputs(&self) -> Result<(), String> {
        for (flag, path) in [("--svg", &self.svg), ("--alloc-trace", &self.alloc_trace)] {
            let Some(path) = path else { continue };
            if path.is_dir() {
                return Err(format!(
                    "{flag} {} is a folder; give a file name in it",
                    path.display()
                ));
            }
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
            if let Some(folder) = parent.filter(|p| !p.is_dir()) {
                return Err(format!(
                    "{flag} {}: the folder {} does not exist; create it first",
                    path.display(),
                    folder.display()
                ));
            }
        }
        Ok(())
    }

    /// Whether `--npl` asks for the batched mode.
    pub fn batched(&self) -> bool {
        !self.npl.is_empty()
    }

    /// The output format, with the old `--json` folded in.
    pub fn format(&self) -> Format {
        if self.json {
            Format::Json
        } else {
            self.output
        }
    }

    /// The arguments an --ab child gets besides its arm's own: the models and every
    /// measurement flag of this run, then one repetition in JSON.
    pub fn child_args(&self) -> Vec<String> {
        self.child_args_for(&self.models)
    }

    /// [`Args::child_args`] for the given models instead of this run's.
    pub fn child_args_for(&self, models: &[PathBuf]) -> Vec<String> {
        let mut a = Vec::new();
        for m in models {
            a.push("-m".to_string());
            a.push(m.display().to_string());
        }
        if self.batched() {
            // The batched mode's own sizes replace the pp/tg tests (which it refuses beside
            // them); each child runs every batch size once.
            a.extend([
                "--npl".to_string(),
                list(&self.npl),
                "--npp".to_string(),
                self.npp.to_string(),
                "--ntg".to_string(),
                self.ntg.to_string(),
            ]);
        } else {
            a.extend([
                "-p".to_string(),
                list(&self.n_prompt),
                "-n".to_string(),
                list(&self.n_gen),
            ]);
        }
        a.extend([
            "--warmup".to_string(),
            self.warmup.to_string(),
            "--device".to_string(),
            device_name(self.device).to_string(),
        ]);
        if self.n_depth.iter().any(|&d| d > 0) {
            a.push("-d".to_string());
            a.push(list(&self.n_depth));
        }
        if let Some(c) = self.ctx {
            a.push("--ctx".to_string());
            a.push(c.to_string());
        }
        if let Some(t) = self.threads {
            a.push("--threads".to_string());
            a.push(t.to_string());
        }
        if self.exact {
            a.push("--exact".to_string());
        }
        for (flag, kv) in [
            ("--cache-type-k", self.cache_type_k),
            ("--cache-type-v", self.cache_type_v),
        ] {
            if let Some(kv) = kv {
                a.extend([flag.to_string(), kv.name().to_string()]);
            }
        }
        if self.no_graph {
            a.push("--no-graph".to_string());
        }
        for (flag, value) in [
            ("--gpu-budget", &self.gpu_budget),
            ("--host-budget", &self.host_budget),
        ] {
            if let Some(v) = value {
                a.push(flag.to_string());
                a.push(v.clone());
            }
        }
        a.extend(["-o", "json", "-r", "1"].map(String::from));
        a
    }
}

/// The command-line spelling of a device request.
pub fn device_name(d: DeviceRequest) -> &'static str {
    match d {
        DeviceRequest::Auto => "auto",
        DeviceRequest::Cpu => "cpu",
        DeviceRequest::Gpu => "gpu",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        let a = Args::try_parse_from(std::iter::once("bench-decode").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        a.validate()?;
        Ok(a)
    }

    #[test]
    fn defaults_are_llama_bench_s() {
        let a = parse(&["-m", "x.gguf"]).unwrap();
        assert_eq!(
            (a.n_prompt[0], a.n_gen[0], a.repetitions, a.warmup),
            (512, 128, 5, 1)
        );
        assert_eq!(a.format(), Format::Md);
        assert_eq!(a.device, DeviceRequest::Auto);
        assert!(a.ab.is_none() && a.svg.is_none());
    }

    #[test]
    fn several_models_and_the_old_spellings() {
        let a = parse(&[
            "-m", "a.gguf", "--model", "b.gguf", "--pp", "64", "--tg", "32", "--runs", "3",
            "--json",
        ])
        .unwrap();
        assert_eq!(a.models, [PathBuf::from("a.gguf"), PathBuf::from("b.gguf")]);
        assert_eq!((a.n_prompt[0], a.n_gen[0], a.repetitions), (64, 32, 3));
        assert_eq!(a.format(), Format::Json);
    }

    #[test]
    fn threads_take_llama_benchs_short_flag() {
        assert_eq!(parse(&["-m", "a", "-t", "3"]).unwrap().threads, Some(3));
        assert!(parse(&["-m", "a", "-t", "0"]).is_err());
    }

    #[test]
    fn a_later_flag_overrides_an_earlier_one() {
        let a = parse(&["-m", "a", "--threads", "2", "-r", "1", "--threads", "4"]).unwrap();
        assert_eq!(a.threads, Some(4));
        assert_eq!(a.models.len(), 1);
    }

    #[test]
    fn bad_values_give_clear_messages() {
        let e = parse(&["-m", "a", "-r", "0"]).unwrap_err();
        assert!(e.contains("at least 1"), "{e}");
        let e = parse(&["-m", "a", "-o", "xml"]).unwrap_err();
        assert!(e.contains("xml") && e.contains("md, json, csv"), "{e}");
        let e = parse(&["-m", "a", "-p", "0", "-n", "0"]).unwrap_err();
        assert!(e.contains("nothing to measure"), "{e}");
        let e = parse(&["-m", "a", "--device", "tpu"]).unwrap_err();
        assert!(e.contains("tpu"), "{e}");
        let e = parse(&["-m", "a", "--threads", "0"]).unwrap_err();
        assert!(e.contains("at least 1"), "{e}");
        let e = parse(&["-m", "a", "-p", "-3"]).unwrap_err();
        assert!(e.contains("-3"), "{e}");
        assert!(parse(&["-p", "8"]).unwrap_err().contains("--model"));
    }

    #[test]
    fn ab_takes_two_arms_including_empty_and_dashed_ones() {
        let a = parse(&[
            "-m",
            "a",
            "--ab",
            "",
            "--no-graph --threads 2",
            "--rounds",
            "3",
        ])
        .unwrap();
        assert_eq!(
            a.ab.as_deref(),
            Some(&["".to_string(), "--no-graph --threads 2".to_string()][..])
        );
        assert_eq!(a.rounds, 3);
        let e = parse(&["-m", "a", "--ab", "", "X=1", "--rounds", "1"]).unwrap_err();
        assert!(e.contains("two samples"), "{e}");
        let e = parse(&["-m", "a", "--ab", "only-one"]).unwrap_err();
        assert!(e.contains("ARM_B") || e.contains("2 values"), "{e}");
        assert!(parse(&["-m", "a", "--rounds", "3"]).is_err());
        assert!(parse(&["-m", "a", "--ab", "", "", "--svg", "x.svg"]).is_err());
    }

    #[test]
    fn batched_mode_takes_a_list_of_batch_sizes_and_refuses_bad_ones() {
        let a = parse(&["-m", "a", "--npl", "1,8,32,64"]).unwrap();
        assert!(a.batched());
        assert_eq!(
            (a.npl.as_slice(), a.npp, a.ntg),
            (&[1, 8, 32, 64][..], 128, 128)
        );
        let a = parse(&["-m", "a", "--npl", "2", "--npp", "16", "--ntg", "4"]).unwrap();
        assert_eq!((a.npl.as_slice(), a.npp, a.ntg), (&[2][..], 16, 4));
        assert!(!parse(&["-m", "a"]).unwrap().batched());
        let e = parse(&["-m", "a", "--npl", "0"]).unwrap_err();
        assert!(
            e.contains("batch size B of --npl must be at least 1, got 0"),
            "{e}"
        );
        let e = parse(&["-m", "a", "--npl", "1,x"]).unwrap_err();
        assert!(e.contains("'x' is not a whole number"), "{e}");
        let e = parse(&["-m", "a", "--npl", "1", "--npp", "0"]).unwrap_err();
        assert!(e.contains("--npp"), "{e}");
        // --npp without --npl, and pp/tg flags beside it, are refused rather than ignored.
        assert!(parse(&["-m", "a", "--npp", "16"]).is_err());
        assert!(parse(&["-m", "a", "--npl", "1", "-p", "16"]).is_err());
        assert!(parse(&["-m", "a", "--npl", "1", "--sweep"]).is_err());
        // --ab compares batched runs too (the children's sizes: child_args).
        assert!(parse(&["-m", "a", "--npl", "1", "--ab", "", "X=1"]).is_ok());
    }

    #[test]
    fn alloc_trace_takes_one_model_and_a_capacity() {
        let a = parse(&["-m", "a", "--alloc-trace", "t.jsonl"]).unwrap();
        assert_eq!(a.alloc_trace, Some(PathBuf::from("t.jsonl")));
        assert_eq!(a.alloc_trace_capacity, crate::alloc_trace::DEFAULT_CAPACITY);
        let a = parse(&[
            "-m",
            "a",
            "--alloc-trace",
            "t",
            "--alloc-trace-capacity",
            "99",
        ])
        .unwrap();
        assert_eq!(a.alloc_trace_capacity, 99);
        let e = parse(&["-m", "a", "-m", "b", "--alloc-trace", "t"]).unwrap_err();
        assert!(e.contains("one model's run"), "{e}");
        let e = parse(&[
            "-m",
            "a",
            "--alloc-trace",
            "t",
            "--alloc-trace-capacity",
            "0",
        ])
        .unwrap_err();
        assert!(e.contains("at least 1"), "{e}");
        assert!(parse(&["-m", "a", "--alloc-trace-capacity", "9"]).is_err());
        assert!(parse(&["-m", "a", "--ab", "", "", "--alloc-trace", "t"]).is_err());
    }

    #[test]
    fn ctx_must_hold_the_tests_and_reaches_the_children() {
        let a = parse(&["-m", "a", "-p", "512", "-n", "128", "--ctx", "32768"]).unwrap();
        assert_eq!(a.ctx, Some(32768));
        assert!(a.child_args().join(" ").contains("--ctx 32768"));
        let e = parse(&["-m", "a", "-p", "512", "-n", "128", "--ctx", "600"]).unwrap_err();
        assert!(e.contains("--ctx 600") && e.contains("641"), "{e}");
        assert!(parse(&["-m", "a", "-p", "512", "-n", "128", "--ctx", "641"]).is_ok());
    }

    #[test]
    fn child_args_carry_the_measurement_flags_and_one_json_repetition() {
        let a = parse(&[
            "-m",
            "a.gguf",
            "-p",
            "8",
            "-n",
            "4",
            "--device",
            "cpu",
            "--threads",
            "2",
            "--exact",
            "-r",
            "7",
        ])
        .unwrap();
        let c = a.child_args().join(" ");
        assert_eq!(
            c,
            "-m a.gguf -p 8 -n 4 --warmup 1 --device cpu --threads 2 --exact -o json -r 1"
        );
        // The child's command line parses, and an arm's flag appended after it wins.
        let mut child = a.child_args();
        child.extend(["--threads", "3"].map(String::from));
        let parsed = parse(&child.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
        assert_eq!((parsed.threads, parsed.repetitions), (Some(3), 1));
        assert_eq!(parsed.format(), Format::Json);
        // A batched run's children get its sizes instead of -p/-n, and their command line
        // parses as the batched mode.
        let a = parse(&[
            "-m",
            "a.gguf",
            "--npl",
            "1,8",
            "--npp",
            "16",
            "--ntg",
            "4",
            "--device",
            "cpu",
            "--ab",
            "",
            "HIPDECODE_FOO=1",
        ])
        .unwrap();
        let child = a.child_args();
        assert_eq!(
            child.join(" "),
            "-m a.gguf --npl 1,8 --npp 16 --ntg 4 --warmup 1 --device cpu -o json -r 1"
        );
        let parsed = parse(&child.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
        assert_eq!(
            (
                parsed.npl.as_slice(),
                parsed.npp,
                parsed.ntg,
                parsed.batched()
            ),
            (&[1, 8][..], 16, 4, true)
        );
        // A depth travels to the children, and a --ctx too small for it is refused.
        let a = parse(&["-m", "a.gguf", "-p", "0", "-n", "64", "-d", "4096,16384"]).unwrap();
        let c = a.child_args().join(" ");
        assert!(
            c.contains("-n 64 --warmup 1 --device auto -d 4096,16384"),
            "{c}"
        );
        let a = parse(&["-m", "a", "-p", "512,4096", "-n", "0,64", "-d", "0,4096"]).unwrap();
        assert_eq!(
            (
                a.n_prompt.as_slice(),
                a.n_gen.as_slice(),
                a.n_depth.as_slice()
            ),
            (&[512, 4096][..], &[0, 64][..], &[0, 4096][..])
        );
        let e = parse(&["-m", "a", "-n", "64", "-d", "4096", "--ctx", "4096"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("-d 4096") && e.contains("--ctx 4673"), "{e}");
    }

    #[test]
    fn a_budget_run_s_children_run_under_the_same_budgets() {
        let a = parse(&[
            "-m",
            "a.gguf",
            "--gpu-budget",
            "6GiB",
            "--host-budget",
            "40GiB",
        ])
        .unwrap();
        let c = a.child_args().join(" ");
        assert!(c.contains("--gpu-budget 6GiB --host-budget 40GiB"), "{c}");
        let parsed = parse(
            &a.child_args()
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
        .unwrap();
        assert_eq!(parsed.gpu_budget.as_deref(), Some("6GiB"));
        assert_eq!(parsed.host_budget.as_deref(), Some("40GiB"));
    }
}
