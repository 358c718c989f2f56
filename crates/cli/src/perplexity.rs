//! `hipdecode perplexity`: the mean negative log-likelihood of a fixed text under the model,
//! the figure that compares KV cache types, quantizations and backends on the same tokens.
//!
//! The method is llama.cpp's (so its figures and these can be read side by side): the text
//! is tokenized once, cut into chunks of `--chunk` tokens, each chunk run from an empty KV
//! cache with its first token made BOS where the model takes one, and the logits of the
//! second half of each chunk's positions scored against the next token
//! ([`decode::nll::ChunkPlan`]). The scoring is [`decode::nll::token_nll`], in f64.

use crate::args::BackendArgs;
use crate::output::outln;
use anyhow::{Context as _, Result};
use decode::backend::Backend;
use decode::batch::{BatchRow, RowKind, RowOutput, StepBatch};
use decode::context::{Context, ContextOptions};
use decode::device::{self, WithBackend};
use decode::model::Model;
use decode::nll::{token_nll, ChunkPlan, NllStats};
use decode::tokenizer::Tokenizer;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct PerplexityArgs {
    /// The GGUF model file.
    #[arg(short, long)]
    model: PathBuf,
    /// The text to score (UTF-8), e.g. data/eval/gnu-gpl3-fdl13.txt.
    #[arg(short = 'f', long, value_name = "FILE")]
    file: PathBuf,
    /// Tokens per chunk, each run from an empty KV cache; the second half of its positions is
    /// scored. Default: --ctx, clamped to the model's trained context.
    #[arg(long, value_name = "N")]
    chunk: Option<usize>,
    /// Evaluate only the first N chunks (a quicker, noisier figure).
    #[arg(long, value_name = "N")]
    chunks: Option<usize>,
    /// Print the result as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    backend: BackendArgs,
}

pub fn perplexity(args: PerplexityArgs) -> Result<()> {
    let choice = device::choose(args.backend.device)?;
    if let Some(note) = &choice.note {
        eprintln!("note: {note}");
    }
    let base = args.backend.settings()?;
    // Before the model loads: a wrong path fails at once.
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading the text to score from {}", args.file.display()))?;
    let file = decode::open_model(&args.model)?;
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let spec = decode::model::ModelSpec::from_gguf(&file)?;
    let trained = spec.context_length.max(1);
    let chunk = match args.chunk {
        Some(n) if n > trained => anyhow::bail!(
            "--chunk {n} is past the model's trained context of {trained} positions, where its \
             likelihoods mean little; give --chunk {trained} or less"
        ),
        Some(n) => n,
        None => args.backend.ctx.min(trained),
    };
    let vocab = tokenizer.vocab();
    let bos = vocab.bos.filter(|_| vocab.add_bos);
    let tokens = tokenizer.encode(&text, bos.is_some());
    let plan = ChunkPlan::new(tokens.len(), chunk, args.chunks)
        .with_context(|| format!("scoring {}", args.file.display()))?;
    // A step carries what the backend's steps are sized for (as `serve` picks), no more than
    // a chunk.
    let max_batch = match choice.backend {
        device::BackendChoice::Gpu(_) => base.gpu_max_batch,
        device::BackendChoice::Cpu => ContextOptions::default().max_batch,
    }
    .min(chunk);
    let bounds = ContextOptions {
        context: chunk,
        ..ContextOptions::default()
    };
    let settings = crate::args::with_budget(base, &choice.backend, &file, &bounds, None, None)?;
    choice.backend.run(
        settings,
        Evaluation {
            args: &args,
            file: &file,
            tokens: &tokens,
            bos,
            plan,
            max_batch,
        },
    )?
}

/// One `hipdecode perplexity` on whichever backend was chosen.
struct Evaluation<'a> {
    args: &'a PerplexityArgs,
    file: &'a Arc<decode::GgufFile>,
    tokens: &'a [u32],
    /// The token each chunk starts with instead of its own, where the model takes a BOS.
    bos: Option<u32>,
    plan: ChunkPlan,
    max_batch: usize,
}

impl WithBackend for Evaluation<'_> {
    type Output = Result<()>;

    // `backend` is a parameter, so it drops after the model and the context that live on it.
    fn run<B: Backend>(self, mut backend: B) -> Result<()> {
        let Evaluation {
            args,
            file,
            tokens,
            bos,
            plan,
            max_batch,
        } = self;
        let model = Model::load(file, &mut backend)?;
        // Every row keeps its logits: a context keeps logits for one row per sequence
        // otherwise, and half of each chunk is scored. The unscored half's logits are computed
        // for nothing, a price of the output matrix on half the rows.
        let options = ContextOptions {
            context: plan.chunk,
            max_batch,
            all_logits: true,
            ..Default::default()
        };
        let mut ctx = Context::new(&model, &mut backend, options)?;
        let kv_type = kv_type_name(&backend);
        let device = backend.describe();
        eprintln!(
            "{} on {device}: {} text tokens, {} chunks of {} ({} scored each), KV cache {kv_type}",
            model.spec().arch_name,
            tokens.len(),
            plan.chunks,
            plan.chunk,
            plan.scored_per_chunk()
        );
        let bar = progress_bar(plan.chunks);
        let started = Instant::now();
        let mut stats = NllStats::new();
        let mut batch = StepBatch::new();
        let mut logits = Vec::new();
        for c in 0..plan.chunks {
            let mut chunk = tokens[plan.tokens(c)].to_vec();
            if let Some(bos) = bos {
                chunk[0] = bos;
            }
            ctx.clear(0);
            for pos0 in (0..plan.chunk).step_by(max_batch) {
                let end = (pos0 + max_batch).min(plan.chunk);
                batch.clear();
                for (pos, &token) in (pos0..end).zip(&chunk[pos0..end]) {
                    let output = match plan.scores(pos) {
                        true => RowOutput::Logits,
                        false => RowOutput::Nothing,
                    };
                    batch.push(BatchRow {
                        seq: 0,
                        pos,
                        token,
                        kind: RowKind::Prefill,
                        output,
                    });
                }
                model
                    .step(&mut backend, &mut ctx, &batch)
                    .with_context(|| format!("running chunk {} at position {pos0}", c + 1))?;
                for pos in (pos0..end).filter(|&p| plan.scores(p)) {
                    ctx.read_logits(&mut backend, pos - pos0, &mut logits)?;
                    let nll = token_nll(&logits, chunk[pos + 1]).with_context(|| {
                        format!(
                            "scoring token {} of chunk {} (position {pos} predicting token {})",
                            plan.tokens(c).start + pos + 1,
                            c + 1,
                            chunk[pos + 1]
                        )
                    })?;
                    stats.add(nll);
                }
            }
            bar.set_message(format!("perplexity {:.4}", stats.perplexity()));
            bar.inc(1);
        }
        bar.finish_and_clear();
        let seconds = started.elapsed().as_secs_f64();
        let report = Report {
            model: args.model.display().to_string(),
            text: args.file.display().to_string(),
            text_tokens: tokens.len(),
            plan,
            stats,
            kv_type,
            kv_bytes: ctx.kv_bytes(),
            device,
            seconds,
        };
        match args.json {
            true => outln!("{}", report.json()),
            false => outln!("{}", report.text()),
        }
    }
}

/// The KV cache's type (`-ctk` / `-ctv`, or the backend's default).
fn kv_type_name<B: Backend>(backend: &B) -> String {
    backend.kv_type().name().to_string()
}

/// A bar of chunks on stderr (hidden where stderr is not a terminal), with the running
/// perplexity.
fn progress_bar(chunks: usize) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(chunks as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "chunk {pos}/{len} [{bar:30}] {elapsed_precise} (eta {eta}) {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// What an evaluation found.
struct Report {
    model: String,
    text: String,
    text_tokens: usize,
    plan: ChunkPlan,
    stats: NllStats,
    kv_type: String,
    kv_bytes: u64,
    device: String,
    seconds: f64,
}

impl Report {
    /// Tokens run per second (every position of every chunk, scored or not).
    fn tok_s(&self) -> f64 {
        (self.plan.chunks * self.plan.chunk) as f64 / self.seconds.max(1e-9)
    }

    fn text(&self) -> String {
        let s = &self.stats;
        let (mean, ppl) = (s.mean(), s.perplexity());
        let spread = match s.ci95() {
            Some(ci) => format!(
                " ± {ci:.6} (95%: 1.96 standard errors); perplexity 95% interval {:.4} .. {:.4}",
                (mean - ci).exp(),
                (mean + ci).exp()
            ),
            None => String::new(),
        };
        format!(
            "{} on {}\n\
             tokens scored  {} ({} chunks of {}, the second half of each; text {} tokens)\n\
             mean NLL       {mean:.6} nats{spread}\n\
             perplexity     {ppl:.4}\n\
             KV cache       {}, {}\n\
             device         {}\n\
             time           {:.1} s ({:.1} tokens/s)",
            self.text,
            self.model,
            s.count(),
            self.plan.chunks,
            self.plan.chunk,
            self.text_tokens,
            self.kv_type,
            decode::memory::human_bytes(self.kv_bytes),
            self.device,
            self.seconds,
            self.tok_s()
        )
    }

    fn json(&self) -> serde_json::Value {
        let s = &self.stats;
        serde_json::json!({
            "model": self.model,
            "text": self.text,
            "text_tokens": self.text_tokens,
            "chunk": self.plan.chunk,
            "chunks": self.plan.chunks,
            "tokens_scored": s.count(),
            "mean_nll": s.mean(),
            "nll_std_error": s.std_error(),
            "nll_ci95": s.ci95(),
            "perplexity": s.perplexity(),
            "kv_cache_type": self.kv_type,
            "kv_cache_bytes": self.kv_bytes,
            "device": self.device,
            "seconds": self.seconds,
            "tokens_per_second": self.tok_s(),
        })
    }
}
