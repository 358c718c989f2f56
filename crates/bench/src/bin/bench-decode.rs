//! `bench-decode -m MODEL [-m MODEL...]`: prompt-processing (pp) and token-generation (tg)
//! speed like llama-bench (mean ± sd over repetitions after warm-up), memory per phase, an
//! optional memory timeline (`--svg`), the GPU allocator's trace (`--alloc-trace`) and A/B
//! comparisons in fresh processes (`--ab`).
//! docs/bench-decode.md describes it; the logic is in the `bench` library.

use anyhow::{Context, Result};
use bench::batched::{BatchedPlan, BatchedReport};
use bench::cli::{Args, Format};
use bench::measure::{run_model, ModelReport, Plan};
use bench::run_setup::DeviceLabel;
use bench::timeline::Timeline;
use bench::{ab, alloc_trace, batched, batched_report, report, svg, sweep};
use clap::Parser;
use decode::backend::{Backend, Precision};
use decode::device::{self, BackendSettings, WithBackend};
use decode::GgufFile;
use std::path::Path;
use std::sync::Arc;

/// Errors are printed as `error:` and `caused by:` lines with exit status 1
/// ([`decode::error_report`]), never returned from `main`.
fn main() -> std::process::ExitCode {
    // Log events (kernel compiles, allocator growth) on stderr as RUST_LOG asks; warnings by
    // default, so the tables on stdout stay alone.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    decode::error_report::exit(run())
}

fn run() -> Result<()> {
    let args = Args::parse_from(decode::kv::element::expand_cache_type_flags(
        std::env::args(),
    ));
    if let Err(message) = args.validate() {
        // The same shape of error clap gives for a bad value, and its exit code.
        clap::Error::raw(
            clap::error::ErrorKind::ValueValidation,
            format!("{message}\n"),
        )
        .with_cmd(&<Args as clap::CommandFactory>::command())
        .exit();
    }
    if let Err(message) = args.check_outputs() {
        anyhow::bail!(message);
    }
    // Every HIPDECODE_* variable is checked whatever the device, as `hipdecode` does, so a
    // malformed limit is an error and a typo a warning.
    for warning in decode::environment::check()? {
        eprintln!("warning: {warning}");
    }
    if args.sweep {
        print!("{}", sweep::run(&args)?);
        return Ok(());
    }
    if args.ab.is_some() {
        print!("{}", ab::run(&args)?);
        return Ok(());
    }
    if let Some(t) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build_global()?;
    }
    let choice = device::choose(args.device)?;
    if let Some(note) = &choice.note {
        eprintln!("note: {note}");
    }
    if args.alloc_trace.is_some() {
        // Before any model is read, so a CPU run fails at once.
        alloc_trace::refuse_cpu(&choice.backend)?;
    }
    let kv_type = decode::kv::KvType::of_flags(args.cache_type_k, args.cache_type_v)
        .map_err(anyhow::Error::msg)?;
    let mut gpu_config = decode::backend::gpu::GpuConfig::from_process()?;
    if let Some(kv) = kv_type {
        gpu_config.kv_type = kv;
    }
    let settings = BackendSettings {
        kv_type,
        cpu_precision: if args.exact {
            Precision::Exact
        } else {
            Precision::Fast
        },
        gpu_graphs: !args.no_graph,
        // Read once: every model of the run is planned for and opens its backend with the
        // same settings.
        gpu_config: Some(gpu_config),
        ..BackendSettings::default()
    };
    if args.batched() {
        return run_batched(&args, &choice, settings);
    }
    let plan = Plan {
        n_prompt: args.n_prompt.clone(),
        n_gen: args.n_gen.clone(),
        n_depth: args.n_depth.clone(),
        context: args.ctx,
        repetitions: args.repetitions,
        warmup: args.warmup,
        max_batch: settings.gpu_max_batch,
    };
    let device = DeviceLabel::of(&choice.backend);
    let mut timeline = args.svg.as_ref().map(|_| Timeline::new());
    let mut reports = Vec::new();
    for path in &args.models {
        let file = decode::open_model(path)?;
        // The plan is made for the run's own context and batch, as `run_model` loads it.
        let context = plan.context();
        let options = decode::layout::LayoutOptions {
            bounds: decode::context::ContextOptions {
                context,
                max_batch: plan.step_rows(),
                ..Default::default()
            },
            step_block_batch: settings.gpu_max_batch,
            ..decode::layout::LayoutOptions::for_config(context, &gpu_config)
        };
        let budget_run = decode::budget_run::for_choice(
            &choice.backend,
            &file,
            args.gpu_budget.as_deref(),
            args.host_budget.as_deref(),
            options,
            gpu_config.cpu_share,
        )?;
        if let Some(b) = &budget_run {
            eprint!("{}: {}", path.display(), b.summary());
        }
        let settings = BackendSettings {
            gpu_offload: budget_run.map(|b| b.offload),
            ..settings.clone()
        };
        let work = Bench {
            path,
            file: &file,
            plan: &plan,
            device: &device,
            timeline: timeline.as_mut(),
        };
        let report = match &args.alloc_trace {
            None => choice.backend.run(settings, work)??,
            Some(trace_path) => {
                let (report, trace) = alloc_trace::run_traced(
                    &choice.backend,
                    settings,
                    work,
                    trace_path,
                    args.alloc_trace_capacity,
                )?;
                eprintln!("{}", alloc_trace::summary(trace_path, &trace));
                report?
            }
        };
        reports.push(report);
    }
    match args.format() {
        Format::Md => print!("{}", report::markdown_report(&reports)),
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&report::json_report(&reports))?
        ),
        Format::Csv => print!("{}", report::csv_report(&reports)),
    }
    if let (Some(path), Some(tl)) = (&args.svg, &timeline) {
        let names: Vec<&str> = reports.iter().map(|r| r.info.name.as_str()).collect();
        let title = format!("bench-decode memory: {}", names.join(", "));
        std::fs::write(path, svg::render(tl, &title))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote the memory timeline to {}", path.display());
    }
    Ok(())
}

/// `--npl`: every model's batched rows, printed in the chosen format.
fn run_batched(
    args: &Args,
    choice: &device::DeviceChoice,
    settings: BackendSettings,
) -> Result<()> {
    let plan = BatchedPlan {
        npp: args.npp,
        ntg: args.ntg,
        npl: args.npl.clone(),
        warmup: args.warmup,
        max_batch: settings.gpu_max_batch,
    };
    let mut reports = Vec::new();
    let mut failed = None;
    for path in &args.models {
        let file = decode::open_model(path)?;
        let work = Batched {
            path,
            file: &file,
            plan: &plan,
        };
        let (report, failure) = choice.backend.run(settings.clone(), work)??;
        if let Some((b, e)) = failure {
            failed = Some(e.context(format!("{}: B = {b}", report.info.name)));
        }
        reports.push(report);
        if failed.is_some() {
            break;
        }
    }
    // The rows measured are printed even when a later batch size failed.
    print_batched(args, &reports)?;
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The batched rows in the chosen format, on stdout.
fn print_batched(args: &Args, reports: &[BatchedReport]) -> Result<()> {
    match args.format() {
        Format::Md => print!("{}", batched_report::markdown_report(reports)),
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&batched_report::json_report(reports))?
        ),
        Format::Csv => print!("{}", batched_report::csv_report(reports)),
    }
    Ok(())
}

/// One model's batched rows, on whichever backend was chosen.
struct Batched<'a> {
    path: &'a Path,
    file: &'a Arc<GgufFile>,
    plan: &'a BatchedPlan,
}

impl WithBackend for Batched<'_> {
    type Output = Result<(BatchedReport, Option<batched::BatchFailure>)>;

    fn run<B: Backend>(self, backend: B) -> Self::Output {
        batched::run_batched(self.path, self.file, backend, self.plan)
    }
}

/// One model's measurement, on whichever backend was chosen.
struct Bench<'a> {
    path: &'a Path,
    file: &'a Arc<GgufFile>,
    plan: &'a Plan,
    device: &'a DeviceLabel,
    timeline: Option<&'a mut Timeline>,
}

impl WithBackend for Bench<'_> {
    type Output = Result<ModelReport>;

    fn run<B: Backend>(self, backend: B) -> Result<ModelReport> {
        run_model(
            self.path,
            self.file,
            backend,
            self.plan,
            self.device,
            self.timeline,
        )
    }
}
