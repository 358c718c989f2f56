//! Generation for several prompts at once through one [`Context`] of N sequences, in the steps
//! [`crate::scheduler::Scheduler`] plans: one decode row per running sequence first, then
//! prompt chunks of the sequences still reading their prompts, up to the context's
//! `max_batch` rows. A sequence that stops leaves the batch and its slot goes to the next
//! waiting request (first come, first served), so more requests than sequences take turns.
//!
//! Each request ends as [`crate::generate::generate`] would end it run alone on a
//! [`crate::session::Session`]: the same stop rules in the same order, the sampler started
//! from its seed, the first token drawn from the prompt's last row.

use crate::backend::Backend;
use crate::batch::{Phase, SeqId};
use crate::context::Context;
use crate::error::{DecodeError, Result};
use crate::generate::StopReason;
use crate::model::Model;
use crate::sampler::SamplerConfig;
use crate::scheduler::{Event, Finish, Request as ScheduledRequest, RequestId};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// When a request's generation ends early (the stop token is kept in its tokens, as
/// `generate` keeps it).
#[derive(Clone)]
pub enum Stop {
    /// At any of these ids (an empty list never stops early).
    Tokens(Vec<u32>),
    /// When the predicate says so (e.g. the tokenizer's end-of-generation test).
    When(Arc<dyn Fn(u32) -> bool + Send + Sync>),
}

impl std::fmt::Debug for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Tokens(ids) => f.debug_tuple("Tokens").field(ids).finish(),
            Stop::When(_) => f.write_str("When(..)"),
        }
    }
}

/// One prompt to continue.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub sampler: SamplerConfig,
    /// New tokens at most (0: the request finishes at once with no tokens).
    pub max_new: usize,
    pub stop: Stop,
}

/// What one request got.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestReport {
    pub prompt_tokens: usize,
    /// Generated ids, including a final stop token.
    pub tokens: Vec<u32>,
    pub stop: StopReason,
    /// The context sequence it ran in (`None` when it needed none: `max_new == 0`).
    pub seq: Option<SeqId>,
    /// From the call's start until it took a sequence.
    pub queued: Duration,
    /// From the start of the first step that carried its prompt to the end of the step that
    /// drew its first token. Steps are shared, so this is wall time, not its own work.
    pub prefill: Duration,
    /// From then until its last token.
    pub decode: Duration,
}

/// The whole run: one report per request, in request order, and the step totals.
#[derive(Clone, Debug, PartialEq)]
pub struct ManyReport {
    pub requests: Vec<RequestReport>,
    /// Steps run, and the rows they carried in all.
    pub steps: usize,
    pub rows: usize,
    /// Time in steps that carried any prompt row, and in steps of decode rows only.
    pub prefill_steps: Duration,
    pub decode_steps: Duration,
}

impl ManyReport {
    /// Generated tokens over every request.
    pub fn generated(&self) -> usize {
        self.requests.iter().map(|r| r.tokens.len()).sum()
    }
}

/// A request the scheduler runs, and its timings.
struct Tracked {
    request: usize,
    started: Option<Instant>,
    first_token: Option<Instant>,
    /// Set when its stop predicate ended it (it is then cancelled in the scheduler).
    stopped: bool,
}

/// Generates for every request through `ctx`'s sequences, calling `on_token(request index,
/// token)` for each token as it is drawn. Every sequence of `ctx` is taken over: a request
/// starts its sequence at position 0 (what the context held there is cleared).
///
/// The steps are [`crate::scheduler::Scheduler`]'s: one decode row per generating sequence first, then prompt
/// chunks, then admissions first come, first served, within the context's `max_batch` rows.
/// Its block pool's budget is the context's whole KV storage (every sequence at full
/// length), so no request waits for blocks or is preempted here, and the prefix cache is off:
/// the storage is the context's fixed segments, not the pool's blocks.
///
/// Requests are checked before any step runs (an empty prompt, a bad sampler setting, a
/// token outside the vocabulary, a prompt longer than a sequence holds are each an
/// [`DecodeError::InvalidArgument`] naming the request). An error of a step ends the call,
/// and so do a request's non-finite logits ([`DecodeError::NonFiniteLogits`]);
/// the context's sequences are then in an unspecified state, so clear them before reuse.
pub fn generate_many<B: Backend>(
    model: &Model<B>,
    backend: &mut B,
    ctx: &mut Context<B>,
    requests: &[Request],
    on_token: &mut dyn FnMut(usize, u32),
) -> Result<ManyReport> {
    let vocab = model.spec().vocab;
    let capacity = ctx.capacity();
    for (i, r) in requests.iter().enumerate() {
        check_request(i, r, vocab, capacity)?;
    }
    let t_start = Instant::now();
    let mut reports: Vec<RequestReport> = requests
        .iter()
        .map(|r| RequestReport {
            prompt_tokens: r.prompt.len(),
            tokens: Vec::new(),
            stop: StopReason::TokenLimit,
            seq: None,
            queued: Duration::ZERO,
            prefill: Duration::ZERO,
            decode: Duration::ZERO,
        })
        .collect();
    let mut scheduler = crate::engine::scheduler_for(ctx)?;
    let mut tracked: HashMap<RequestId, Tracked> = HashMap::new();
    // A request for no tokens runs nothing, as `generate` returns at once for it.
    for (i, r) in requests.iter().enumerate() {
        if r.max_new == 0 {
            continue;
        }
        let stop = match &r.stop {
            Stop::Tokens(ids) => ids.clone(),
            Stop::When(_) => Vec::new(),
        };
        let id = scheduler
            .submit(ScheduledRequest {
                prompt: r.prompt.clone(),
                sampler: r.sampler,
                max_new: r.max_new,
                stop,
            })
            .map_err(|e| DecodeError::InvalidArgument(format!("request {i}: {e}")))?;
        tracked.insert(
            id,
            Tracked {
                request: i,
                started: None,
                first_token: None,
                stopped: false,
            },
        );
    }
    let mut run = ManyReport {
        requests: Vec::new(),
        steps: 0,
        rows: 0,
        prefill_steps: Duration::ZERO,
        decode_steps: Duration::ZERO,
    };
    while scheduler.pending() > 0 {
        let plan = scheduler.plan_step();
        let step_start = Instant::now();
        // The sequences that start in this step (`run_plan` restarts their slots): a started
        // slot's first row is its request's.
        for (r, row) in plan.batch.rows().enumerate() {
            let first = plan.batch.rows().position(|o| o.seq == row.seq) == Some(r);
            if first && plan.started.iter().any(|(slot, _)| *slot == row.seq) {
                if let Some(t) = tracked.get_mut(&plan.requests[r]) {
                    reports[t.request].seq = Some(row.seq);
                    reports[t.request].queued = step_start - t_start;
                    t.started.get_or_insert(step_start);
                }
            }
        }
        let results = crate::engine::run_plan(model, backend, ctx, &scheduler, &plan)?;
        // A request whose logits are not finite ends the call, as an error of a step does.
        if let Some((_, e)) = results.failed.into_iter().next() {
            return Err(e);
        }
        let tokens = results.tokens;
        let now = Instant::now();
        if !plan.batch.is_empty() {
            run.steps += 1;
            run.rows += plan.batch.len();
            if plan.batch.phase() == Phase::Decode {
                run.decode_steps += now - step_start;
            } else {
                run.prefill_steps += now - step_start;
            }
        }
        for event in scheduler.finish_step(&plan, &tokens) {
            match event {
                Event::Token { id, token } => {
                    let Some(t) = tracked.get_mut(&id) else {
                        continue;
                    };
                    if t.stopped {
                        continue;
                    }
                    let report = &mut reports[t.request];
                    if t.first_token.is_none() {
                        t.first_token = Some(now);
                        report.prefill = t.started.map_or(Duration::ZERO, |s| now - s);
                    }
                    report.tokens.push(token);
                    report.decode = t.first_token.map_or(Duration::ZERO, |f| now - f);
                    on_token(t.request, token);
                    // A predicate stop is checked first, as `generate` checks it.
                    if let Stop::When(f) = &requests[t.request].stop {
                        if f(token) {
                            t.stopped = true;
                            report.stop = StopReason::EndOfSequence;
                            scheduler.cancel(id);
                        }
                    }
                }
                Event::Finished { id, reason } => {
                    let Some(t) = tracked.get(&id) else {
                        continue;
                    };
                    if !t.stopped {
                        reports[t.request].stop = match reason {
                            Finish::Stop => StopReason::EndOfSequence,
                            Finish::TokenLimit => StopReason::TokenLimit,
                            Finish::ContextFull => StopReason::ContextFull,
                            // Only its own predicate cancels a request here.
                            Finish::Cancelled => StopReason::EndOfSequence,
                        };
                    }
                }
            }
        }
    }
    run.requests = reports;
    Ok(run)
}

/// Refuses a request no step could run, naming it and what is wrong.
fn check_request(i: usize, r: &Request, vocab: usize, capacity: usize) -> Result<()> {
    let bad = |what: String| Err(DecodeError::InvalidArgument(format!("request {i}: {what}")));
    if r.prompt.is_empty() {
        return bad(
            "the prompt is empty; give at least one token (most models want BOS first)".into(),
        );
    }
    if let Err(e) = r.sampler.validate() {
        return bad(match e {
            DecodeError::InvalidArgument(m) => m,
            other => other.to_string(),
        });
    }
    if let Some(&t) = r.prompt.iter().find(|&&t| t as usize >= vocab) {
        return bad(format!(
            "prompt token {t} is outside the vocabulary of {vocab} tokens"
        ));
    }
    if r.prompt.len() > capacity {
        return bad(format!(
            "its prompt of {} tokens does not fit a sequence of the context, which holds {} \
             positions; make the context larger (ContextOptions::context) or cut the prompt",
            r.prompt.len(),
            capacity
        ));
    }
    Ok(())
}
