//! `hipdecode profile`: per-op GPU times of decode steps (of one sequence or of several at
//! once) or of a prefill.

use crate::output::{out, outln};
use anyhow::Result;
use decode::backend::gpu::GpuConfig;
use decode::backend::Backend;
use decode::batch::{RowOutput, StepBatch};
use decode::context::{Context, ContextOptions};
use decode::device::{self, BackendSettings, DeviceRequest, WithBackend};
use decode::gguf_loader::GgufFile;
use decode::model::Model;
use decode::sampler::SamplerConfig;
use decode::session::Session;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct ProfileArgs {
    /// The GGUF model file.
    #[arg(short, long)]
    model: PathBuf,
    /// Prompt tokens processed before the profiled steps (their KV is what attention reads);
    /// with --sequences, each sequence's prompt.
    #[arg(short = 'p', long, default_value_t = 64)]
    prompt_tokens: usize,
    /// Decode steps profiled.
    #[arg(short = 'n', long, default_value_t = 32)]
    steps: usize,
    /// Sequences decoded together: each profiled step carries one row of each (as a server's
    /// steps do with that many requests running).
    #[arg(short = 'b', long, default_value_t = 1)]
    sequences: usize,
    /// auto or gpu (the CPU backend has no per-op profile).
    #[arg(long, default_value = "gpu")]
    device: DeviceRequest,
    /// Profile the prompt's prefill instead of the decode steps.
    #[arg(long, conflicts_with = "sequences")]
    prefill: bool,
}

pub fn profile(args: ProfileArgs) -> Result<()> {
    anyhow::ensure!(args.steps > 0, "--steps must be at least 1");
    anyhow::ensure!(args.sequences > 0, "--sequences must be at least 1");
    let choice = device::choose(args.device)?;
    let file = decode::open_model(&args.model)?;
    let settings = BackendSettings {
        gpu_config: Some(GpuConfig::from_process()?),
        ..BackendSettings::default()
    };
    choice.backend.run(
        settings,
        Profiling {
            args: &args,
            file: &file,
        },
    )?
}

/// One `hipdecode profile`.
struct Profiling<'a> {
    args: &'a ProfileArgs,
    file: &'a Arc<GgufFile>,
}

/// A varied prompt of `n` tokens below `vocab`, different for each `salt`.
fn prompt(n: usize, vocab: u32, salt: u32) -> Vec<u32> {
    (0..n.max(1) as u32)
        .map(|i| {
            (i.wrapping_add(salt.wrapping_mul(7919))
                .wrapping_mul(2_654_435_761)
                >> 7)
                % vocab
        })
        .collect()
}

impl WithBackend for Profiling<'_> {
    type Output = Result<()>;

    fn run<B: Backend>(self, mut backend: B) -> Result<()> {
        let Profiling { args, file } = self;
        anyhow::ensure!(
            backend.enable_profiling(),
            "the {} backend has no per-op profile; use --device gpu",
            backend.describe()
        );
        if args.sequences > 1 {
            return profile_many(args, file, backend);
        }
        // Prefill in chunks as long as bench-decode's, so the prefill profile is the one it
        // measures.
        let options = ContextOptions {
            context: args.prompt_tokens + args.steps + 1,
            max_batch: decode::backend::gpu::DEFAULT_MAX_BATCH,
            ..Default::default()
        };
        let mut model = Session::load(file, backend, options)?;
        let vocab = model.spec().vocab as u32;
        let prompt = prompt(args.prompt_tokens, vocab, 0);
        model.forward(&prompt)?;
        let what = if args.prefill {
            // The first prefill pays one-time costs (the vendor library's algorithm queries
            // and lazily loaded kernels): profile a second one, as bench-decode warms up.
            let _ = model.backend_mut().profile_report();
            model.reset();
            model.backend_mut().enable_profiling();
            model.forward(&prompt)?;
            format!(
                "the prefill of {} prompt tokens, after one warm-up prefill",
                prompt.len()
            )
        } else {
            // Only decode steps go into the table: the prefill's ops are dropped with this
            // report.
            let _ = model.backend_mut().profile_report();
            model.backend_mut().enable_profiling();
            let mut next = model.last_argmax()?;
            for _ in 0..args.steps {
                model.decode(next)?;
                next = model.last_argmax()?;
            }
            format!(
                "{} prompt tokens, then {} decode steps",
                prompt.len(),
                args.steps
            )
        };
        outln!(
            "model    {} ({} layers)\nbackend  {}\nprofiled {what}",
            args.model.display(),
            model.spec().n_layers,
            model.backend().describe(),
        )?;
        if let Some(report) = model.backend_mut().profile_report() {
            out!("{}", report?)?;
        }
        Ok(())
    }
}

/// Decode steps of `args.sequences` rows, one per sequence, after each sequence's prompt and
/// one unprofiled warm-up step (its first use of each kernel loads it).
fn profile_many<B: Backend>(
    args: &ProfileArgs,
    file: &Arc<GgufFile>,
    mut backend: B,
) -> Result<()> {
    let b = args.sequences;
    let model = Model::load(file, &mut backend)?;
    let options = ContextOptions {
        context: args.prompt_tokens + args.steps + 2,
        max_batch: decode::backend::gpu::DEFAULT_MAX_BATCH.max(b),
        sequences: b,
        ..Default::default()
    };
    let mut ctx = Context::new(&model, &mut backend, options)?;
    let vocab = model.spec().vocab as u32;
    let greedy = RowOutput::Sample(SamplerConfig::default());
    let mut next = vec![0u32; b];
    for (seq, slot) in next.iter_mut().enumerate() {
        let p = prompt(args.prompt_tokens, vocab, seq as u32 + 1);
        let batch = StepBatch::prefill(seq, 0, &p, greedy);
        for s in model.step(&mut backend, &mut ctx, &batch)? {
            *slot = s.token;
        }
    }
    let mut batch = StepBatch::new();
    for step in 0..=args.steps {
        if step == 1 {
            // The prompts' and the warm-up step's ops leave with this report.
            let _ = backend.profile_report();
            backend.enable_profiling();
        }
        batch.clear();
        batch.push_decode_each(&next, |seq| ctx.len(seq), greedy);
        for s in model.step(&mut backend, &mut ctx, &batch)? {
            next[s.seq] = s.token;
        }
    }
    outln!(
        "model    {} ({} layers)\nbackend  {}\nprofiled {b} sequences of {} prompt tokens, then {} \
         decode steps of {b} rows, after one warm-up step",
        args.model.display(),
        model.spec().n_layers,
        backend.describe(),
        args.prompt_tokens.max(1),
        args.steps
    )?;
    if let Some(report) = backend.profile_report() {
        out!("{}", report?)?;
    }
    drop(ctx);
    drop(model);
    Ok(())
}
