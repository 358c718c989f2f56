//! The `hipdecode` command line: `run` generates text, `chat` talks through the model's chat
//! template, `serve` answers OpenAI-compatible HTTP requests, `perplexity` scores a text,
//! `inspect` reports on a GGUF file, `profile` times a decode step's ops on the GPU, `plan`
//! plans GPU memory under a budget, `selftest` checks the GPU's kernels against the CPU.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use decode::backend::Backend;
use decode::context::ContextOptions;
use decode::device::{self, WithBackend};
use decode::generate::{generate, StopReason};
use decode::gguf_loader;
use decode::memory::human_bytes;
use decode::sampler::SamplerConfig;
use decode::stop_strings::StopStrings;
use decode::tokenizer::{TextStream, Tokenizer};
use std::path::PathBuf;
use std::process::ExitCode;

mod args;
mod chat;
mod load_progress;
mod logging;
mod output;
mod perplexity;
mod profile;
mod selftest;
mod serve;

use args::{BackendArgs, SamplingArgs};
use output::{out, outln};

#[derive(Parser)]
#[command(
    name = "hipdecode",
    version,
    about = "Run quantized GGUF language models"
)]
struct Cli {
    /// More log events on standard error (repeat for more: -v info, -vv debug, -vvv trace);
    /// RUST_LOG overrides it.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming tokens as they come.
    Run(RunArgs),
    /// Chat in the terminal through the model's chat template; each turn computes only what
    /// follows the part of the conversation the KV cache already holds.
    Chat(chat::ChatArgs),
    /// Serve the model over HTTP with OpenAI's chat and text completion endpoints (streaming
    /// or not), /v1/models, /health and Prometheus /metrics; requests share a KV budget and
    /// wait for it rather than fail.
    Serve(serve::ServeArgs),
    /// Score a text: mean negative log-likelihood and perplexity over chunks of --chunk
    /// tokens, each from an empty KV cache, the second half of each chunk's positions scored
    /// (llama.cpp's method), with the 95% error of the mean.
    Perplexity(perplexity::PerplexityArgs),
    /// Print a GGUF file's metadata and tensors, or export one tensor as .npy.
    Inspect(InspectArgs),
    /// Time every op of decode steps on the GPU: a per-kernel table with bytes moved.
    Profile(profile::ProfileArgs),
    /// Plan GPU memory under a budget: what must stay resident, which weights stay on the
    /// device and which are read from host memory, and the predicted decode speed. Needs no
    /// GPU.
    Plan(PlanArgs),
    /// Measure whether managed memory migrates to the device here (a read kernel over managed
    /// memory written on the host, twice, against device memory); refuses it otherwise.
    ProbeManaged(ProbeArgs),
    /// Measure how fast the host's cores multiply offloaded weights (the hybrid offload's host
    /// half, Q4_K and Q6_K), the rate `hipdecode plan --host-compute-gbps` takes. Needs no GPU.
    ProbeHost(ProbeArgs),
    /// Measure the host link: a kernel reading pinned host memory in place (zero-copy) and the
    /// copy engine moving it to the device, the rates `hipdecode plan --zero-copy-gbps` and
    /// `--copy-gbps` take.
    ProbeLink(ProbeArgs),
    /// Check this machine's GPU: every kernel against its CPU reference at small shapes, then
    /// a tiny model of each architecture, GPU against CPU. Prints a pass/fail table and a
    /// report to paste into an issue. Exit status 0 all passed, 1 something failed, 2 no GPU.
    Selftest(selftest::SelftestArgs),
    /// List every HIPDECODE_* variable: its value here (or its default) and what it does,
    /// then whether the set ones are valid.
    Env(EnvArgs),
}

#[derive(clap::Args)]
struct EnvArgs {
    /// Print the table docs/memory.md carries instead.
    #[arg(long)]
    markdown: bool,
}

#[derive(clap::Args)]
struct ProbeArgs {
    /// Bytes each pass reads (a multiple of 4, at least 4KiB).
    #[arg(long, default_value = "256MiB")]
    bytes: String,
}

#[derive(clap::Args)]
struct PlanArgs {
    /// The GGUF model file.
    #[arg(short, long)]
    model: PathBuf,
    /// The cap on everything the run takes on the device: bytes, a decimal with a binary unit
    /// ("512MiB", "6.5GiB") or a percentage of the device ("75%"). With `--tp`, one budget
    /// for every GPU or a comma-separated budget per GPU ("20GiB,16GiB"). Default:
    /// HIPDECODE_GPU_BUDGET.
    #[arg(long)]
    gpu_budget: Option<String>,
    /// Plan each GPU of a tensor-parallel split over N GPUs: each rank's part of the weights,
    /// and the KV cache and activations of its heads, under its own budget.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    tp: u64,
    /// KV cache positions (clamped to the model's context length).
    #[arg(long, visible_alias = "ctx", default_value_t = 2048)]
    context: usize,
    /// The KV cache's key type the plan prices: f32, f16 (the default) or q8_0 (also `-ctk`).
    #[arg(long = "cache-type-k", value_name = "TYPE")]
    cache_type_k: Option<decode::kv::KvType>,
    /// The KV cache's value type (also `-ctv`); one flag sets both.
    #[arg(long = "cache-type-v", value_name = "TYPE")]
    cache_type_v: Option<decode::kv::KvType>,
    /// The device's total memory, which a percentage budget is taken of ("141GiB"). Default:
    /// ask the GPU when one is present.
    #[arg(long)]
    device_memory: Option<String>,
    /// Device memory read rate in GB/s for the prediction (default: the H200's 4400).
    #[arg(long)]
    hbm_gbps: Option<f64>,
    /// Rate of kernels reading pinned host memory in place, GB/s (default: 50, PCIe Gen5 x16).
    #[arg(long)]
    zero_copy_gbps: Option<f64>,
    /// Rate of copies from pinned host memory to the device, GB/s (default: 55).
    #[arg(long)]
    copy_gbps: Option<f64>,
    /// Rate of the host's cores on offloaded products beside the GPU's zero-copy reads (the
    /// hybrid split), GB/s; 0 for zero-copy only (default: the H200 host's measured rate, or
    /// 0 when HIPDECODE_OFFLOAD_CPU_SHARE=off).
    #[arg(long)]
    host_compute_gbps: Option<f64>,
    /// List every weight tensor with its rank and placement.
    #[arg(long)]
    tensors: bool,
    /// List the buffers behind the per-tag needs (the layout's, in the load's order).
    #[arg(long)]
    buffers: bool,
    /// Also run the managed-memory probe on the GPU (as `hipdecode probe-managed`).
    #[arg(long)]
    probe: bool,
}

#[derive(clap::Args)]
struct RunArgs {
    /// The GGUF model file.
    #[arg(short, long)]
    model: PathBuf,
    /// The prompt text (it may start with a dash: `-p "-5 degrees"`).
    #[arg(
        short,
        long,
        required_unless_present = "file",
        allow_hyphen_values = true
    )]
    prompt: Option<String>,
    /// Read the prompt from this file instead (as llama.cpp's `-f`).
    #[arg(short = 'f', long, value_name = "FILE", conflicts_with = "prompt")]
    file: Option<PathBuf>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long, default_value_t = 64)]
    n_predict: usize,
    /// Stop where this text appears in the continuation (left out of it); repeatable.
    #[arg(long = "stop", value_name = "TEXT")]
    stops: Vec<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    backend: BackendArgs,
    /// Do not prepend the BOS token.
    #[arg(long)]
    no_bos: bool,
    /// Print timing and memory as one JSON line on stderr at the end ("device" holds the GPU
    /// allocator's reserved, cached and peak bytes and the bytes outside it; null on the CPU).
    #[arg(long)]
    json_stats: bool,
    /// GPU: cap everything the run takes on the device (bytes, "6.5GiB", "75%"): the offload
    /// planner keeps what fits on the device and reads the other weights in place from
    /// pinned host memory; the allocator's limit enforces the cap. Default:
    /// HIPDECODE_GPU_BUDGET; unset, no budget.
    #[arg(long)]
    gpu_budget: Option<String>,
    /// The most pinned host memory the offloaded weights may take (bytes or "32GiB").
    /// Default: HIPDECODE_HOST_BUDGET, else 90% of the host's available memory.
    #[arg(long)]
    host_budget: Option<String>,
    /// Split the model over this many ranks (tensor parallelism): query heads, K/V heads and
    /// the feed-forward width are divided, each rank a thread with its part. CPU only so far.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    tp: u32,
}

#[derive(clap::Args)]
struct InspectArgs {
    /// The GGUF file.
    model: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Export this tensor (dequantized to f32) ...
    #[arg(long, requires = "npy")]
    tensor: Option<String>,
    /// ... to this .npy file.
    #[arg(long, requires = "tensor")]
    npy: Option<PathBuf>,
}

/// Errors are printed as `error:` and `caused by:` lines with exit status 1
/// ([`decode::error_report`]), never returned from `main`.
fn main() -> ExitCode {
    if let Some(message) = args::llama_cpp_layer_flag(std::env::args().skip(1)) {
        eprintln!("error: {message}");
        return ExitCode::from(2);
    }
    let cli = Cli::parse_from(decode::kv::element::expand_cache_type_flags(
        std::env::args(),
    ));
    // The server logs its requests by default.
    let base = match cli.command {
        Command::Serve(_) => tracing::Level::INFO,
        _ => tracing::Level::WARN,
    };
    logging::init(cli.verbose, base);
    decode::error_report::exit(match cli.command {
        // `env` shows a bad value instead of refusing to start over it.
        Command::Env(args) => env(&args),
        Command::Selftest(args) => {
            return match check_environment() {
                Ok(()) => selftest::selftest(&args, cli.verbose > 0),
                Err(e) => decode::error_report::exit(Err(e)),
            }
        }
        command => check_environment().and_then(|()| dispatch(command)),
    })
}

fn dispatch(command: Command) -> Result<()> {
    match command {
        Command::Run(args) => run(args),
        Command::Chat(args) => chat::chat(args),
        Command::Serve(args) => serve::serve(args),
        Command::Perplexity(args) => perplexity::perplexity(args),
        Command::Inspect(args) => inspect(args),
        Command::Profile(args) => profile::profile(args),
        Command::Plan(args) => plan(args),
        Command::ProbeManaged(args) => probe_managed(&args.bytes),
        Command::ProbeHost(args) => probe_host(&args.bytes),
        Command::ProbeLink(args) => probe_link(&args.bytes),
        Command::Env(args) => env(&args),
        Command::Selftest(args) => match selftest::selftest(&args, false) {
            code if code == std::process::ExitCode::SUCCESS => Ok(()),
            _ => anyhow::bail!("the self-test did not pass"),
        },
    }
}

/// Every `HIPDECODE_*` variable is checked whatever the device, so a bad limit is not silently
/// ignored on a CPU run; unknown names are warned about.
fn check_environment() -> Result<()> {
    for warning in decode::environment::check()? {
        eprintln!("warning: {warning}");
    }
    Ok(())
}

fn env(args: &EnvArgs) -> Result<()> {
    if args.markdown {
        return out!("{}", decode::environment::markdown_table());
    }
    let env = knobs::Env::process();
    out!("{}", decode::environment::listing(&env))?;
    match decode::environment::check_env(&env) {
        Ok(warnings) if warnings.is_empty() => outln!("\nevery variable set is valid")?,
        Ok(warnings) => {
            outln!()?;
            for w in warnings {
                outln!("warning: {w}")?;
            }
        }
        Err(e) => outln!("\nerror: {e}")?,
    }
    Ok(())
}

fn run(args: RunArgs) -> Result<()> {
    let choice = device::choose(args.backend.device)?;
    if let Some(note) = &choice.note {
        eprintln!("note: {note}");
    }
    let base = args.backend.settings()?;
    let sampler = args.sampling.config()?;
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .with_context(|| format!("reading the prompt from {}", path.display()))?,
        (None, None) => anyhow::bail!("give a prompt: -p TEXT or -f FILE"),
    };
    let file = decode::open_model(&args.model)?;
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let settings = args::with_budget(
        base,
        &choice.backend,
        &file,
        &decode::context::ContextOptions {
            context: args.backend.ctx,
            ..Default::default()
        },
        args.gpu_budget.as_deref(),
        args.host_budget.as_deref(),
    )?;
    let generation = Generation {
        args: &args,
        prompt: &prompt,
        file: &file,
        tokenizer: &tokenizer,
        sampler,
    };
    match (&choice.backend, args.tp) {
        (_, 1) => choice.backend.run(settings, generation)?,
        (device::BackendChoice::Cpu, ranks) => generation.run_split(ranks as usize, &settings),
        (device::BackendChoice::Gpu(_), ranks) => anyhow::bail!(
            "--tp {ranks} runs on the CPU only so far: splitting over GPUs needs NCCL or RCCL \
             device collectives, which are not built yet; pass --device cpu, or drop --tp"
        ),
    }
}

/// One `hipdecode run` on whichever backend was chosen.
struct Generation<'a> {
    args: &'a RunArgs,
    prompt: &'a str,
    file: &'a std::sync::Arc<gguf_loader::GgufFile>,
    tokenizer: &'a Tokenizer,
    sampler: SamplerConfig,
}

impl WithBackend for Generation<'_> {
    type Output = Result<()>;

    fn run<B: Backend>(self, backend: B) -> Result<()> {
        let Generation {
            args,
            prompt: text,
            file,
            tokenizer,
            sampler,
        } = self;
        let options = ContextOptions {
            context: args.backend.ctx,
            ..Default::default()
        };
        let (mut model, load_time) = load_progress::load(file, backend, options)?;
        let prompt = tokenizer.encode(text, !args.no_bos && tokenizer.vocab().add_bos);
        eprintln!(
            "{} on {}: loaded in {}; {} prompt tokens, context {}",
            model.spec().arch_name,
            model.backend().describe(),
            load_progress::seconds(load_time),
            prompt.len(),
            model.options().context
        );
        let report = stream_generation(&mut model, args, text, &prompt, tokenizer, sampler)?;
        let mem = model.memory();
        eprintln!("{mem}");
        if let Some(device) = model.backend().device_report() {
            eprint!("{}", device?);
        }
        if args.json_stats {
            // The GPU allocator's own figures beside the per-tag ones, named as bench-decode
            // names them.
            let device = match model.backend().device_memory() {
                Some(memory) => decode::memory::DeviceNumbers::from(&memory?).to_json(),
                None => serde_json::Value::Null,
            };
            let stats = serde_json::json!({
                "prompt_tokens": report.prompt_tokens,
                "generated_tokens": report.tokens.len(),
                "prefill_tok_s": report.prefill_tok_s(),
                "decode_tok_s": report.decode_tok_s(),
                "memory": {
                    "weights": mem.get(decode::MemoryTag::Weights),
                    "kv_cache": mem.get(decode::MemoryTag::KvCache),
                    "activations": mem.get(decode::MemoryTag::Activations),
                    "workspace": mem.get(decode::MemoryTag::Workspace),
                    "total": mem.total(),
                    "total_human": human_bytes(mem.total()),
                },
                "device": device,
            });
            eprintln!("{stats}");
        }
        Ok(())
    }
}

impl Generation<'_> {
    /// `hipdecode run --tp N` on the CPU: the model split over `ranks` threads
    /// ([`decode::split_session::SplitSession`]), each rank's books printed.
    fn run_split(self, ranks: usize, settings: &device::BackendSettings) -> Result<()> {
        let Generation {
            args,
            prompt: text,
            file,
            tokenizer,
            sampler,
        } = self;
        if args.json_stats {
            anyhow::bail!("--json-stats does not cover --tp yet; drop one of them");
        }
        let options = ContextOptions {
            context: args
                .backend
                .ctx
                .min(decode::model::ModelSpec::from_gguf(file)?.context_length),
            ..Default::default()
        };
        let started = std::time::Instant::now();
        let settings = settings.clone();
        let mut split =
            decode::split_session::SplitSession::load(file, ranks, options, move || {
                device::cpu_backend(&settings)
            })?;
        let prompt = tokenizer.encode(text, !args.no_bos && tokenizer.vocab().add_bos);
        eprintln!(
            "{} split over {ranks} CPU ranks: loaded in {}; {} prompt tokens, context {}",
            split.spec().arch_name,
            load_progress::seconds(started.elapsed()),
            prompt.len(),
            options.context
        );
        stream_generation(&mut split, args, text, &prompt, tokenizer, sampler)?;
        for (rank, mem) in split.memory()?.iter().enumerate() {
            eprintln!("rank {rank}: {mem}");
        }
        Ok(())
    }
}

/// Prints `text`, then generates after `prompt` on `session`, streaming the tokens' text to
/// stdout until a stop token, a stop string, the token limit or a full context, and prints
/// the timing line on stderr.
fn stream_generation(
    session: &mut impl decode::generate::Generator,
    args: &RunArgs,
    text: &str,
    prompt: &[u32],
    tokenizer: &Tokenizer,
    sampler: SamplerConfig,
) -> Result<decode::generate::GenerationReport> {
    if let Some(note) = args.sampling.seed_note(&sampler) {
        eprintln!("{note}");
    }
    out!("{text}")?;
    let mut stream = TextStream::new(tokenizer);
    let mut stops = StopStrings::new(args.stops.iter().cloned());
    let at_stop_string = std::cell::Cell::new(false);
    // A failed write of the text stops the generation; the error is returned after it.
    let write_error = std::cell::RefCell::new(None);
    let report = generate(
        session,
        prompt,
        args.n_predict,
        sampler,
        &|id| tokenizer.is_stop(id) || at_stop_string.get() || write_error.borrow().is_some(),
        &mut |id| {
            if let Err(e) = out!("{}", stops.push(&stream.push(id))) {
                write_error.borrow_mut().get_or_insert(e);
            }
            at_stop_string.set(stops.stopped());
        },
    )?;
    if let Some(e) = write_error.into_inner() {
        return Err(e);
    }
    outln!("{}{}", stops.push(&stream.finish()), stops.finish())?;
    let stop = match report.stop {
        _ if stops.stopped() => "stop string",
        StopReason::EndOfSequence => "end of sequence",
        StopReason::TokenLimit => "token limit",
        StopReason::ContextFull => "context full",
    };
    eprintln!(
        "prompt {} tokens at {:.1} tok/s; generated {} tokens, decode at {:.1} tok/s; stopped at {stop}",
        report.prompt_tokens,
        report.prefill_tok_s(),
        report.tokens.len(),
        report.decode_tok_s()
    );
    Ok(report)
}

/// `hipdecode plan`: the budget resolved (a percentage against the device's memory), the
/// model's resident needs estimated, the planner run, and its plan printed.
/// The budget of each of `ranks` GPUs: `--gpu-budget` (one for all, or one per GPU), else
/// HIPDECODE_GPU_BUDGET for each.
fn plan_budgets(args: &PlanArgs, ranks: usize) -> Result<Vec<offload::Budget>> {
    use offload::Budget;
    let Some(text) = &args.gpu_budget else {
        let budget = offload::knobs::GPU_BUDGET.read()?.ok_or_else(|| {
            anyhow::anyhow!(
                "no GPU budget: pass --gpu-budget (e.g. 8GiB, or 75% of the device) or set {}",
                offload::knobs::GPU_BUDGET.name
            )
        })?;
        return Ok(vec![budget; ranks]);
    };
    let each: Vec<Budget> = text
        .split(',')
        .map(|part| Budget::parse("--gpu-budget", part.trim()))
        .collect::<std::result::Result<_, _>>()?;
    match each.len() {
        1 => Ok(vec![each[0]; ranks]),
        n if n == ranks => Ok(each),
        n => anyhow::bail!(
            "--gpu-budget gives {n} budgets for --tp {ranks}: give one for every GPU, or one \
             budget per GPU separated by commas"
        ),
    }
}

fn plan(args: PlanArgs) -> Result<()> {
    use offload::{parse_size, LinkModel};
    let ranks = args.tp as usize;
    let budgets = plan_budgets(&args, ranks)?;
    // What every GPU's plan shares, read once: the device's size (asked of the GPU only when a
    // budget is a share of it), the model, the settings and the link rates.
    let share = budgets.iter().find(|b| b.needs_device_total());
    let device = match &args.device_memory {
        Some(text) => Some((parse_size("--device-memory", text)?, "--device-memory")),
        None if share.is_some() && device::gpu_present() => {
            let gpu = device::probe_gpu().map_err(|reason| {
                anyhow::anyhow!(
                    "{}; the GPU could not be asked: {reason}",
                    offload::BudgetError::NeedsDeviceTotal {
                        budget: share.map(|b| b.to_string()).unwrap_or_default()
                    }
                )
            })?;
            let info = gpu
                .mem_get_info()
                .map_err(|e| anyhow::anyhow!("reading the GPU's memory: {e}"))?;
            Some((info.total, "asked the GPU"))
        }
        None => None,
    };
    let file = decode::open_model(&args.model)?;
    let mut gpu_config = decode::backend::gpu::GpuConfig::from_process()?;
    if let Some(kv) = decode::kv::KvType::of_flags(args.cache_type_k, args.cache_type_v)
        .map_err(anyhow::Error::msg)?
    {
        gpu_config.kv_type = kv;
    }
    let defaults = decode::budget_run::default_link(gpu_config.cpu_share)?;
    let given = args.hbm_gbps.is_some()
        || args.zero_copy_gbps.is_some()
        || args.copy_gbps.is_some()
        || args.host_compute_gbps.is_some();
    let [hbm, zero_copy, copy] = LinkModel::H200_DEFAULT_GBPS;
    let link = if given {
        LinkModel::from_gbps(
            args.hbm_gbps.unwrap_or(hbm),
            args.zero_copy_gbps.unwrap_or(zero_copy),
            args.copy_gbps.unwrap_or(copy),
            "given on the command line; H200 defaults for the rates not given",
        )
        .with_host_compute_gbps(
            args.host_compute_gbps
                .unwrap_or(defaults.host_compute / 1e9),
        )
    } else {
        defaults
    };
    let shared = PlanInputs {
        file,
        gpu_config,
        link,
        device,
    };
    for (rank, budget) in budgets.into_iter().enumerate() {
        if ranks > 1 {
            if rank > 0 {
                outln!()?;
            }
            outln!("== GPU {rank} of {ranks} (tensor-parallel rank {rank})")?;
        }
        let shard = decode::model::Shard::new(rank, ranks)?;
        plan_rank(&args, &shared, budget, shard)?;
    }
    if args.probe {
        probe_managed(&format!("{}", decode::managed_probe::PROBE_BYTES))?;
    }
    Ok(())
}

/// What every GPU's plan of one `hipdecode plan` shares.
struct PlanInputs {
    file: std::sync::Arc<decode::GgufFile>,
    gpu_config: decode::backend::gpu::GpuConfig,
    link: offload::LinkModel,
    /// The device's total memory and where it came from, when known.
    device: Option<(u64, &'static str)>,
}

/// `hipdecode plan` for one GPU: `shard`'s part of the model under `budget`.
fn plan_rank(
    args: &PlanArgs,
    shared: &PlanInputs,
    budget: offload::Budget,
    shard: decode::model::Shard,
) -> Result<()> {
    let PlanInputs {
        file,
        gpu_config,
        link,
        device,
    } = shared;
    let budget_source = match &args.gpu_budget {
        Some(text) => format!("--gpu-budget {text}"),
        None => offload::knobs::GPU_BUDGET.name.to_string(),
    };
    let bytes = budget.resolve(device.map(|(total, _)| total))?;
    let options = decode::layout::LayoutOptions {
        shard,
        ..decode::layout::LayoutOptions::for_config(args.context, gpu_config)
    };
    let layout = decode::layout::ModelLayout::new(file, &options)?;
    let plan = offload::plan(&decode::budget_run::plan_request(
        &layout,
        bytes,
        link.clone(),
    )?)?;
    let s = &layout.spec;
    let weights: u64 = layout.tensors.iter().map(|t| t.bytes).sum();
    outln!(
        "model    {} ({}, {} layers, {} weight tensors, {} MiB of weights on the GPU backend)",
        args.model.display(),
        s.arch_name,
        s.n_layers,
        layout.tensors.len(),
        offload::mib(weights)
    )?;
    outln!(
        "run      context {} (KV {}), batch {}, {} products, vendor GEMM buffers {}",
        layout.context,
        options.kv_type,
        options.bounds.max_batch,
        if options.int8_matvec { "int8" } else { "exact" },
        if options.vendor_gemm {
            "reserved"
        } else {
            "not reserved"
        }
    )?;
    let device = match device {
        Some((total, source)) => format!("; device memory {} MiB ({source})", offload::mib(*total)),
        None => String::new(),
    };
    outln!(
        "budget   {budget} from {budget_source} = {} MiB{device}",
        offload::mib(bytes)
    )?;
    outln!("{plan}")?;
    if args.buffers {
        outln!(
            "buffers (the layout the load allocates, in its order; the allocator's slack \
             from replaying them):"
        )?;
        let beside_weights = layout
            .buffers
            .iter()
            .filter(|b| b.presence != decode::layout::Presence::Weight);
        for b in beside_weights {
            let when = match b.presence {
                decode::layout::Presence::ReplacedBy(_) => " (replaced at load; cached)",
                decode::layout::Presence::WithHostWeights => " (when a weight is on the host)",
                _ => "",
            };
            outln!(
                "  {:<16} {:>10} MiB  {}{when}",
                b.tag.name(),
                offload::mib(b.bytes),
                b.what
            )?;
        }
    }
    if args.tensors {
        out!("{}", plan.tensor_listing())?;
    }
    Ok(())
}

/// `hipdecode probe-managed`, and `plan --probe`: prints the probe's rates and verdict. A
/// refusal is a verdict, not a failure: the exit status is 0 when the probe ran.
fn probe_managed(bytes: &str) -> Result<()> {
    let bytes = offload::parse_size("--bytes", bytes)?;
    let bytes = usize::try_from(bytes).context("--bytes does not fit this machine's words")?;
    let gpu = device::probe_gpu()
        .map_err(|reason| anyhow::anyhow!("the managed-memory probe needs a GPU: {reason}"))?;
    out!("{}", decode::managed_probe::probe(&gpu, bytes)?)?;
    Ok(())
}

/// `hipdecode probe-link`: the host link's zero-copy and copy rates.
fn probe_link(bytes: &str) -> Result<()> {
    let bytes = offload::parse_size("--bytes", bytes)?;
    let bytes = usize::try_from(bytes).context("--bytes does not fit this machine's words")?;
    let gpu = device::probe_gpu()
        .map_err(|reason| anyhow::anyhow!("the link probe needs a GPU: {reason}"))?;
    let probe = decode::link_probe::probe(&gpu, bytes)?;
    out!("{probe}")?;
    keep_rates(|rates| {
        rates.link = Some(offload::measured::LinkRates {
            device: gpu.name().unwrap_or_else(|_| "this GPU".into()),
            zero_copy_gbps: probe.zero_copy_gbps,
            copy_gbps: probe.copy_gbps,
            measured_at: utc_now(),
        });
    })
}

/// The time now, UTC, to the second.
fn utc_now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Records what a probe measured in the rates file that the offload planner reads
/// ([`offload::measured`]), keeping what the other probe left there, and says where.
fn keep_rates(update: impl FnOnce(&mut offload::measured::MeasuredRates)) -> Result<()> {
    let Some(path) = offload::measured::rates_path()? else {
        return outln!(
            "the rates are not kept ({} is off, or there is no cache folder); pass them to \
             hipdecode plan with its --*-gbps flags",
            offload::knobs::RATES_FILE.name
        );
    };
    // A broken file is replaced: this probe is the fix its error names.
    let mut rates = offload::measured::MeasuredRates::load(&path).unwrap_or_default();
    update(&mut rates);
    rates.save(&path)?;
    outln!(
        "kept in {} for hipdecode plan and --gpu-budget runs",
        path.display()
    )
}

fn probe_host(bytes: &str) -> Result<()> {
    let bytes = offload::parse_size("--bytes", bytes)?;
    let bytes = usize::try_from(bytes).context("--bytes does not fit this machine's words")?;
    outln!(
        "host product rate (one token, 4096 columns, median of 5, weights streamed from memory):"
    )?;
    let mut slowest: Option<(f64, usize)> = None;
    for format in [gguf_loader::GgmlType::Q4K, gguf_loader::GgmlType::Q6K] {
        let r = decode::backend::host::q8::measure_rate(format, bytes, 5)?;
        if slowest.is_none_or(|(gbps, _)| r.gbps() < gbps) {
            slowest = Some((r.gbps(), r.threads));
        }
        outln!(
            "  {:<5} {:>7.1} GB/s  ({:.0} MiB in {:.2} ms, {} threads)",
            format.name(),
            r.gbps(),
            r.bytes as f64 / (1 << 20) as f64,
            r.seconds * 1e3,
            r.threads
        )?;
    }
    let Some((gbps, threads)) = slowest else {
        return Ok(());
    };
    // The slower format: a plan priced with it does not promise what the host cannot give.
    keep_rates(|rates| {
        rates.host = Some(offload::measured::HostRate {
            gbps,
            threads,
            measured_at: utc_now(),
        });
    })
}

fn inspect(args: InspectArgs) -> Result<()> {
    let file = decode::open_model(&args.model)?;
    if let (Some(name), Some(out)) = (&args.tensor, &args.npy) {
        gguf_loader::inspect::write_tensor_npy(&file, name, out)
            .with_context(|| format!("exporting '{name}' to {}", out.display()))?;
        eprintln!("wrote {name} as f32 to {}", out.display());
        return Ok(());
    }
    if args.json {
        outln!("{}", gguf_loader::inspect::json_report(&file))?;
    } else {
        let mut text = Vec::new();
        gguf_loader::inspect::write_text_report(&file, &mut text)?;
        out!("{}", String::from_utf8_lossy(&text))?;
    }
    Ok(())
}
