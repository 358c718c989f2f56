//! `bench-decode -m MODEL`: prompt-processing (pp) and token-generation (tg) speed of the
//! decoder, as medians over several runs after warm-up, plus a memory breakdown.

use anyhow::{bail, Result};
use bench::{median, process_memory};
use clap::Parser;
use decode::backend::{Backend, Precision};
use decode::device::{self, BackendSettings, DeviceRequest, WithBackend};
use decode::memory::{human_bytes, MemoryTag};
use decode::model::{Model, ModelOptions};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "bench-decode",
    about = "Measure prefill and decode speed of a GGUF model"
)]
struct Args {
    /// The GGUF model file.
    #[arg(short, long)]
    model: PathBuf,
    /// Prompt tokens per pp run.
    #[arg(long, default_value_t = 64)]
    pp: usize,
    /// Generated tokens per tg run.
    #[arg(long, default_value_t = 32)]
    tg: usize,
    /// Measured runs (the median is reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Unmeasured runs first.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// CPU threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Use f32 activations (the reference path) instead of 16-bit integer ones.
    #[arg(long)]
    exact: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// auto, cpu or gpu (auto picks the GPU when one is usable).
    #[arg(long, default_value = "auto")]
    device: DeviceRequest,
    /// GPU: run decode steps eagerly instead of replaying a captured graph.
    #[arg(long)]
    no_graph: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.runs == 0 || args.pp == 0 || args.tg == 0 {
        bail!("--runs, --pp and --tg must be at least 1");
    }
    if let Some(t) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t.max(1))
            .build_global()?;
    }
    let file = decode::open_model(&args.model)?;
    let precision = if args.exact {
        Precision::Exact
    } else {
        Precision::Fast
    };
    let choice = device::choose(args.device)?;
    if let Some(note) = &choice.note {
        eprintln!("note: {note}");
    }
    let settings = BackendSettings {
        cpu_precision: precision,
        gpu_graphs: !args.no_graph,
        ..BackendSettings::default()
    };
    choice.backend.run(
        settings,
        Bench {
            args: &args,
            file: &file,
        },
    )?
}

/// The measurement, on whichever backend was chosen.
struct Bench<'a> {
    args: &'a Args,
    file: &'a std::sync::Arc<decode::GgufFile>,
}

impl WithBackend for Bench<'_> {
    type Output = Result<()>;

    fn run<B: Backend>(self, backend: B) -> Result<()> {
        let Bench { args, file } = self;
        bench(args, file, backend)
    }
}

fn bench<B: Backend>(
    args: &Args,
    file: &std::sync::Arc<decode::GgufFile>,
    backend: B,
) -> Result<()> {
    let options = ModelOptions {
        context: args.pp + args.tg + 1,
        max_batch: args.pp.clamp(1, BackendSettings::default().gpu_max_batch),
        all_logits: false,
    };
    let mut model = Model::load(file, backend, options)?;
    let vocab = model.spec().vocab as u32;
    // A fixed, varied token sequence; the speed does not depend on which ids they are.
    let prompt: Vec<u32> = (0..args.pp as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % vocab)
        .collect();

    let mut pp = Vec::new();
    let mut tg = Vec::new();
    for run in 0..args.warmup + args.runs {
        model.reset();
        let t = Instant::now();
        model.forward(&prompt)?;
        let mut next = model.last_argmax()?;
        let pp_time = t.elapsed();
        let t = Instant::now();
        for _ in 0..args.tg {
            model.forward(&[next])?;
            next = model.last_argmax()?;
        }
        let tg_time = t.elapsed();
        if run >= args.warmup {
            pp.push(pp_time);
            tg.push(tg_time);
        }
    }
    let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64();
    let pp_rate = rate(args.pp, median(&pp));
    let tg_rate = rate(args.tg, median(&tg));
    let mem = model.memory();
    let (rss, peak) = process_memory().unwrap_or((0, 0));
    if args.json {
        let j = serde_json::json!({
            "model": args.model.display().to_string(),
            "backend": model.backend().describe(),
            "pp_tokens": args.pp, "tg_tokens": args.tg, "runs": args.runs,
            "pp_tok_s": pp_rate, "tg_tok_s": tg_rate,
            "memory": {
                "weights": mem.get(MemoryTag::Weights),
                "kv_cache": mem.get(MemoryTag::KvCache),
                "activations": mem.get(MemoryTag::Activations),
                "workspace": mem.get(MemoryTag::Workspace),
                "process_rss": rss, "process_peak_rss": peak,
            },
        });
        println!("{j}");
    } else {
        println!(
            "model    {} ({}, {} layers)",
            args.model.display(),
            model.spec().arch_name,
            model.spec().n_layers
        );
        println!("backend  {}", model.backend().describe());
        println!(
            "pp{:<5}  {pp_rate:8.1} tok/s   (median of {} runs after {} warm-up)",
            args.pp, args.runs, args.warmup
        );
        println!("tg{:<5}  {tg_rate:8.1} tok/s", args.tg);
        println!("memory   {mem}");
        println!(
            "process  rss {}, peak rss {}",
            human_bytes(rss),
            human_bytes(peak)
        );
        if let Some(device) = model.backend().device_report() {
            print!("{}", device?);
        }
    }
    Ok(())
}
