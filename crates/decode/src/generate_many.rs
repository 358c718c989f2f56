//! Generation for several prompts at once through one [`Context`] of N sequences: each step
//! carries one decode row per running sequence first, then prompt chunks of the sequences
//! still reading their prompts, up to the context's `max_batch` rows. A sequence that stops
//! leaves the batch and its slot is cleared for the next waiting request (first come, first
//! served), so more requests than sequences take their turns.
//!
//! Each request ends as [`crate::generate::generate`] would end it run alone on a
//! [`crate::session::Session`]: the same stop rules in the same order, the sampler started
//! from its seed, the first token drawn from the prompt's last row. Its slots are the context's
//! sequences, sized when the context was made: it does not drive [`crate::scheduler`] (no KV
//! budget, no preemption), whose engine loop can take its place under the same API.

use crate::backend::Backend;
use crate::batch::{BatchRow, RowKind, RowOutput, SeqId, StepBatch};
use crate::context::Context;
use crate::error::{DecodeError, Result};
use crate::generate::StopReason;
use crate::model::Model;
use crate::sampler::SamplerConfig;
use std::collections::VecDeque;
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

impl Stop {
    fn is_stop(&self, token: u32) -> bool {
        match self {
            Stop::Tokens(ids) => ids.contains(&token),
            Stop::When(f) => f(token),
        }
    }
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

/// A request holding a sequence.
struct Running {
    request: usize,
    /// Prompt tokens already in the cache.
    prefilled: usize,
    /// The token drawn last, which the next decode row feeds (`None` while prefilling).
    next: Option<u32>,
    /// The step it last had a decode row in, so decode rows take turns when the context
    /// has more sequences than `max_batch` rows.
    last_step: usize,
    started: Option<Instant>,
    first_token: Option<Instant>,
}

/// Generates for every request through `ctx`'s sequences, calling `on_token(request index,
/// token)` for each token as it is drawn. Every sequence of `ctx` is taken over: a request
/// starts its sequence at position 0 (what the context held there is cleared).
///
/// Requests are checked before any step runs (an empty prompt, a bad sampler setting, a
/// token outside the vocabulary, a prompt longer than a sequence holds are each an
/// [`DecodeError::InvalidArgument`] naming the request). An error of a step ends the call;
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
    // A request for no tokens runs nothing, as `generate` returns at once for it.
    let mut waiting: VecDeque<usize> = (0..requests.len())
        .filter(|&i| requests[i].max_new > 0)
        .collect();
    let mut slots: Vec<Option<Running>> = (0..ctx.sequences()).map(|_| None).collect();
    let max_batch = ctx.options().max_batch;
    let mut run = ManyReport {
        requests: Vec::new(),
        steps: 0,
        rows: 0,
        prefill_steps: Duration::ZERO,
        decode_steps: Duration::ZERO,
    };
    let mut batch = StepBatch::new();
    loop {
        // Admission, first come first served, into any free sequence.
        for (seq, slot) in slots.iter_mut().enumerate() {
            if slot.is_none() {
                let Some(request) = waiting.pop_front() else {
                    break;
                };
                ctx.clear(seq);
                reports[request].seq = Some(seq);
                reports[request].queued = t_start.elapsed();
                *slot = Some(Running {
                    request,
                    prefilled: 0,
                    next: None,
                    last_step: 0,
                    started: None,
                    first_token: None,
                });
            }
        }
        if slots.iter().all(Option::is_none) {
            break;
        }
        batch.clear();
        // Decode rows first (issue 21's order), the longest-waiting first where they do not
        // all fit.
        let mut decoders: Vec<SeqId> = (0..slots.len())
            .filter(|&s| slots[s].as_ref().is_some_and(|r| r.next.is_some()))
            .collect();
        decoders.sort_by_key(|&s| slots[s].as_ref().map_or(0, |r| r.last_step));
        for &seq in decoders.iter().take(max_batch) {
            let Some(r) = slots[seq].as_mut() else {
                continue;
            };
            let Some(token) = r.next else { continue };
            r.last_step = run.steps + 1;
            batch.push(BatchRow {
                seq,
                pos: ctx.len(seq),
                token,
                kind: RowKind::Decode,
                output: RowOutput::Sample(requests[r.request].sampler),
            });
        }
        // Then prompt chunks, in admission order of the slots' requests, while rows are left.
        let mut prefilling: Vec<SeqId> = (0..slots.len())
            .filter(|&s| slots[s].as_ref().is_some_and(|r| r.next.is_none()))
            .collect();
        prefilling.sort_by_key(|&s| slots[s].as_ref().map_or(0, |r| r.request));
        let step_start = Instant::now();
        let mut has_prefill = false;
        for seq in prefilling {
            let room = max_batch - batch.len();
            if room == 0 {
                break;
            }
            let Some(r) = slots[seq].as_mut() else {
                continue;
            };
            let prompt = &requests[r.request].prompt;
            let take = room.min(prompt.len() - r.prefilled);
            let end = r.prefilled + take;
            let last = if end == prompt.len() {
                RowOutput::Sample(requests[r.request].sampler)
            } else {
                RowOutput::Nothing
            };
            batch.push_prefill(seq, r.prefilled, &prompt[r.prefilled..end], last);
            r.prefilled = end;
            r.started.get_or_insert(step_start);
            has_prefill = true;
        }
        let sampled = model.step(backend, ctx, &batch)?;
        let step_time = step_start.elapsed();
        let now = Instant::now();
        run.steps += 1;
        run.rows += batch.len();
        if has_prefill {
            run.prefill_steps += step_time;
        } else {
            run.decode_steps += step_time;
        }
        for s in sampled {
            let Some(r) = slots[s.seq].as_mut() else {
                return Err(DecodeError::InvalidArgument(format!(
                    "a token was drawn for sequence {}, which runs no request",
                    s.seq
                )));
            };
            let request = &requests[r.request];
            let report = &mut reports[r.request];
            if r.first_token.is_none() {
                r.first_token = Some(now);
                report.prefill = r.started.map_or(Duration::ZERO, |t| now - t);
            }
            report.tokens.push(s.token);
            on_token(r.request, s.token);
            // The order of `generate`'s checks, so each request ends as it would alone.
            let stop = if request.stop.is_stop(s.token) {
                Some(StopReason::EndOfSequence)
            } else if report.tokens.len() >= request.max_new {
                Some(StopReason::TokenLimit)
            } else if ctx.len(s.seq) + 1 > capacity {
                Some(StopReason::ContextFull)
            } else {
                None
            };
            match stop {
                Some(reason) => {
                    report.stop = reason;
                    report.decode = r.first_token.map_or(Duration::ZERO, |t| now - t);
                    slots[s.seq] = None;
                    // Its slot is free for a waiting request from the next step on.
                    ctx.clear(s.seq);
                }
                None => r.next = Some(s.token),
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
