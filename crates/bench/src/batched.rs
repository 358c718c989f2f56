//! `--npl`: the batched measurement, shaped like llama.cpp's `llama-batched-bench`. For each
//! batch size B, a context of B sequences: every sequence's `npp`-token prompt is prefilled
//! (prompt rows of several sequences share a step, up to the context's `max_batch` rows),
//! then `ntg` decode steps of B rows, one per sequence. The times are of those two phases;
//! the rates are llama-batched-bench's (S_TG = B × ntg ÷ decode time).
//!
//! The loop drives `Model::step` itself rather than `generate_many`, whose scheduler mixes
//! decode rows of sequences that finished their prompts into later prompt steps: the two
//! phases would then share steps and neither time would be what llama-batched-bench reports.

use crate::model_info::ModelInfo;
use anyhow::{bail, Context as _, Result};
use decode::backend::Backend;
use decode::batch::{RowOutput, StepBatch};
use decode::context::{Context, ContextOptions};
use decode::model::Model;
use decode::sampler::SamplerConfig;
use decode::GgufFile;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// What to run.
#[derive(Clone, Debug)]
pub struct BatchedPlan {
    /// Prompt tokens per sequence.
    pub npp: usize,
    /// Decode steps after the prompts.
    pub ntg: usize,
    /// Batch sizes (sequences), one row each, in this order.
    pub npl: Vec<usize>,
    /// Unmeasured runs of each row first.
    pub warmup: usize,
    /// The most prompt rows one step carries (raised to B, so a decode step is one step).
    pub max_batch: usize,
}

/// One batch size's measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchedRow {
    pub pp: usize,
    pub tg: usize,
    pub b: usize,
    /// Positions the run fills: B × (PP + TG).
    pub n_kv: usize,
    /// Seconds prefilling every prompt (the first tokens drawn), and of the TG decode steps.
    pub t_pp: f64,
    pub t_tg: f64,
    /// Bytes the context's KV cache took (the backend's kv_cache tag, before and after
    /// `Context::new`).
    pub kv_bytes: u64,
    /// The most device memory the process held in the row: the allocator's peak reserved
    /// bytes plus what the process holds outside it at the row's end (`None` on the CPU).
    pub peak_device: Option<u64>,
}

impl BatchedRow {
    /// Prompt tokens per second over every sequence: B × PP ÷ T_PP.
    pub fn s_pp(&self) -> f64 {
        (self.b * self.pp) as f64 / self.t_pp
    }

    /// Generated tokens per second over every sequence: B × TG ÷ T_TG.
    pub fn s_tg(&self) -> f64 {
        (self.b * self.tg) as f64 / self.t_tg
    }

    pub fn t(&self) -> f64 {
        self.t_pp + self.t_tg
    }

    /// N_KV ÷ T.
    pub fn s(&self) -> f64 {
        self.n_kv as f64 / self.t()
    }
}

/// One model's rows.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchedReport {
    pub info: ModelInfo,
    pub backend: String,
    pub warmup: usize,
    pub max_batch: usize,
    /// The rows measured, up to the first batch size that failed.
    pub rows: Vec<BatchedRow>,
}

/// A batch size that failed, with why; the sizes after it were not run.
pub type BatchFailure = (usize, anyhow::Error);

/// Loads the model onto `backend` and measures each batch size of the plan, stopping at the
/// first that fails: the report holds the rows before it, returned with the failure.
pub fn run_batched<B: Backend>(
    path: &Path,
    file: &Arc<GgufFile>,
    mut backend: B,
    plan: &BatchedPlan,
) -> Result<(BatchedReport, Option<BatchFailure>)> {
    if plan.npp == 0 || plan.ntg == 0 || plan.npl.contains(&0) {
        bail!("--npp, --ntg and every --npl value must be at least 1");
    }
    let info = ModelInfo::from_file(path, file);
    let model =
        Model::load(file, &mut backend).with_context(|| format!("loading {}", path.display()))?;
    let vocab = model.spec().vocab;
    if vocab == 0 {
        bail!("{} has an empty vocabulary", path.display());
    }
    let mut rows = Vec::new();
    let mut failure = None;
    for &b in &plan.npl {
        let row = match measure(&model, &mut backend, plan, b, vocab) {
            Ok(row) => row,
            Err(e) => {
                failure = Some((b, e));
                break;
            }
        };
        eprintln!(
            "{}: B = {b}: S_PP {:.2} t/s, S_TG {:.2} t/s",
            info.name,
            row.s_pp(),
            row.s_tg()
        );
        rows.push(row);
    }
    let report = BatchedReport {
        info,
        backend: backend.describe(),
        warmup: plan.warmup,
        max_batch: plan.max_batch,
        rows,
    };
    Ok((report, failure))
}

/// The row of batch size `b`: a context of `b` sequences, warm-up runs, one measured run.
fn measure<B: Backend>(
    model: &Model<B>,
    backend: &mut B,
    plan: &BatchedPlan,
    b: usize,
    vocab: usize,
) -> Result<BatchedRow> {
    let positions = plan.npp + plan.ntg;
    // A decode step carries one row per sequence, so a step holds at least B rows; more
    // than every prompt row at once would only size activations nothing fills.
    let max_batch = plan.max_batch.max(b).min(b * plan.npp).max(1);
    backend.reset_device_peaks();
    let options = ContextOptions {
        context: positions,
        max_batch,
        all_logits: false,
        sequences: b,
        kv_blocks: None,
    };
    // A backend that runs fewer sequences per step refuses here, with its reason.
    let mut ctx = Context::new(model, backend, options)?;
    let kv_bytes = ctx.kv_bytes();
    if ctx.capacity() < positions {
        bail!(
            "the model holds {} positions per sequence, but --npp {} --ntg {} needs {positions}",
            ctx.capacity(),
            plan.npp,
            plan.ntg
        );
    }
    // Each sequence its own stretch of one varied token list.
    let tokens = crate::measure::prompt_tokens(plan.npp * b, vocab);
    let prompts: Vec<Vec<u32>> = tokens.chunks(plan.npp).map(<[u32]>::to_vec).collect();
    let mut times = (0.0, 0.0);
    for _ in 0..=plan.warmup {
        times = run_once(model, backend, &mut ctx, &prompts, plan.ntg, max_batch)?;
    }
    let peak_device = match backend.device_memory() {
        Some(d) => {
            let d = d.context("reading device memory")?;
            Some(d.stats.peak_reserved_bytes + d.outside_allocator)
        }
        None => None,
    };
    let (t_pp, t_tg) = times;
    if !(t_pp > 0.0 && t_tg > 0.0) {
        bail!("a phase took no measurable time (T_PP {t_pp} s, T_TG {t_tg} s)");
    }
    Ok(BatchedRow {
        pp: plan.npp,
        tg: plan.ntg,
        b,
        n_kv: b * positions,
        t_pp,
        t_tg,
        kv_bytes,
        peak_device,
    })
}

/// One run from empty sequences: the prompts packed into steps of `max_batch` rows, then
/// `ntg` decode steps of every sequence. Returns the two phases' seconds. Greedy tokens, read
/// back at each step's end, so a phase's time covers its work.
fn run_once<B: Backend>(
    model: &Model<B>,
    backend: &mut B,
    ctx: &mut Context<B>,
    prompts: &[Vec<u32>],
    ntg: usize,
    max_batch: usize,
) -> Result<(f64, f64)> {
    for seq in 0..prompts.len() {
        ctx.clear(seq);
    }
    let greedy = RowOutput::Sample(SamplerConfig::default());
    let mut next = vec![0u32; prompts.len()];
    let mut batch = StepBatch::new();
    let t0 = Instant::now();
    // Every prompt row in order, cut into steps wherever max_batch falls.
    let mut done = vec![0usize; prompts.len()];
    let mut seq = 0;
    while seq < prompts.len() {
        batch.clear();
        while seq < prompts.len() && batch.len() < max_batch {
            let p = &prompts[seq];
            let take = (max_batch - batch.len()).min(p.len() - done[seq]);
            let end = done[seq] + take;
            let last = if end == p.len() {
                greedy
            } else {
                RowOutput::Nothing
            };
            batch.push_prefill(seq, done[seq], &p[done[seq]..end], last);
            done[seq] = end;
            if end == p.len() {
                seq += 1;
            }
        }
        for s in model.step(backend, ctx, &batch)? {
            next[s.seq] = s.token;
        }
    }
    let t_pp = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for _ in 0..ntg {
        batch.clear();
        batch.push_decode_each(&next, |seq| ctx.len(seq), greedy);
        for s in model.step(backend, ctx, &batch)? {
            next[s.seq] = s.token;
        }
    }
    Ok((t_pp, t1.elapsed().as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_llama_batched_bench_s() {
        let r = BatchedRow {
            pp: 128,
            tg: 32,
            b: 4,
            n_kv: 4 * 160,
            t_pp: 2.0,
            t_tg: 4.0,
            kv_bytes: 0,
            peak_device: None,
        };
        assert_eq!(r.s_pp(), 256.0);
        assert_eq!(r.s_tg(), 32.0);
        assert_eq!(r.t(), 6.0);
        assert!((r.s() - 640.0 / 6.0).abs() < 1e-12);
    }
}
