//! Continuous batching: which sequences run in the next step, and which of their rows.
//!
//! Requests wait in arrival order. Each step the scheduler fills a [`StepBatch`] under a
//! per-step token limit: first one decode row for every running sequence that is generating
//! (oldest first), then prompt chunks of running sequences still prefilling, then new
//! sequences admitted first come, first served while the context has a sequence slot and the
//! KV pool has blocks for the whole prompt. A sequence's blocks come from the [`BlockPool`]:
//! when a decode row finds the pool full, the most recently admitted sequence that has no row
//! in the step yet is preempted (its blocks go back, and it waits at the head of the queue to
//! be recomputed from its tokens so far), so the oldest running sequence always advances and
//! every admitted sequence finishes. A request that could never fit the budget is refused at
//! submission, naming the bytes it needs.
//!
//! The scheduler holds no device memory and runs no model: [`Scheduler::plan_step`] says what
//! to run, the engine runs it (copying the blocks [`StepPlan::copies`] names first), and
//! [`Scheduler::finish_step`] takes the sampled tokens and reports what happened.
//!
//! On a model with ring-buffered sliding-window layers, each running sequence also holds one
//! of the context's ring runs ([`RingRuns`]), and a prefix found in the pool is gone on from
//! only as far as a finished sequence's run holds the window before it: the new sequence takes
//! that run over ([`Scheduler::ring_run`] says which run a slot's ring tables name).

use crate::batch::{BatchRow, RowKind, RowOutput, SeqId, StepBatch};
use crate::kv::{BlockCopy, BlockId, BlockPool, PoolError, RingRuns, SeqBlocks};
use crate::sampler::SamplerConfig;
use std::collections::VecDeque;

/// A request's handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// What to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub sampler: SamplerConfig,
    /// Tokens to generate at most.
    pub max_new: usize,
    /// Tokens that end the generation (kept in its output).
    pub stop: Vec<u32>,
}

/// The bounds a scheduler works in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Sequences running at once (the context's sequence slots).
    pub max_running: usize,
    /// Rows one step carries at most (decode rows and prompt tokens together).
    pub step_tokens: usize,
    /// Positions one sequence may reach (the model's or the context's length).
    pub max_positions: usize,
    /// Whether prompts start from blocks the prefix cache holds.
    pub prefix_cache: bool,
    /// The ring runs of the context's sliding-window layers, where it has any.
    pub rings: Option<RingConfig>,
}

/// A context's ring runs as the scheduler hands them out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// Runs: the context's sequences, one run each at the start.
    pub runs: usize,
    /// Slots every ring holds past its window (at least the step's rows less one): how far
    /// before a finished run's end a prefix may end and still find its window there.
    pub slack: usize,
}

/// The default per-step token limit: the GPU's prefill chunk, a step's largest batch.
pub const DEFAULT_STEP_TOKENS: usize = 64;

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Stop,
    TokenLimit,
    ContextFull,
    Cancelled,
}

/// What a finished step produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Token { id: RequestId, token: u32 },
    Finished { id: RequestId, reason: Finish },
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error(
        "a request of {tokens} positions (prompt and new tokens) needs {needed_bytes} bytes of \
         KV cache but the budget is {budget_bytes} bytes, so it could never run; shorten the \
         prompt or the token limit, or raise the KV budget"
    )]
    NeverFits {
        tokens: usize,
        needed_bytes: u64,
        budget_bytes: u64,
    },
    #[error("{0}")]
    Invalid(String),
}

/// One step to run.
#[derive(Debug, Default)]
pub struct StepPlan {
    /// The rows; a row's `seq` is the sequence's slot in the context.
    pub batch: StepBatch,
    /// The request of each row.
    pub requests: Vec<RequestId>,
    /// Blocks to copy before the step writes (copy-on-write of shared blocks).
    pub copies: Vec<BlockCopy>,
    /// Requests preempted while planning: their slots were cleared and they wait to be
    /// recomputed.
    pub preempted: Vec<RequestId>,
    /// Slots whose sequence starts in this step, each with the tokens its blocks already hold
    /// (a prefix found in the prefix cache; none without): the context restarts them there.
    pub started: Vec<(SeqId, Vec<u32>)>,
    /// The request of each of `started`, in the same order.
    pub admitted: Vec<RequestId>,
}

struct Sequence {
    id: RequestId,
    request: Request,
    /// Prompt and generated tokens.
    tokens: Vec<u32>,
    generated: usize,
    /// Positions whose keys and values are written.
    computed: usize,
    blocks: SeqBlocks,
    /// Its slot in the context while running.
    slot: Option<SeqId>,
    /// Its ring run while running, on a model with window rings.
    run: Option<usize>,
    /// When it was (last) admitted: preemption takes the latest.
    admitted: u64,
    cancelled: bool,
    /// Ended by an error of its step ([`Scheduler::fail`]): what that step wrote of it is not
    /// to be trusted, so none of it goes into the prefix cache.
    failed: bool,
}

impl Sequence {
    /// Positions to compute before the next token can be sampled.
    fn to_prefill(&self) -> usize {
        self.tokens.len() - self.computed
    }
}

/// One running sequence's share of the KV pool, for the memory report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SequenceUsage {
    pub id: RequestId,
    pub slot: SeqId,
    /// Positions whose keys and values are written.
    pub positions: usize,
    /// Blocks its table holds (a block shared with another sequence counts for each).
    pub blocks: usize,
    pub bytes: u64,
}

/// The scheduler over one context's sequence slots and one KV pool.
pub struct Scheduler {
    config: SchedulerConfig,
    pool: BlockPool,
    rings: Option<RingRuns>,
    waiting: VecDeque<Sequence>,
    /// In admission order, oldest first.
    running: Vec<Sequence>,
    free_slots: Vec<SeqId>,
    next_id: u64,
    clock: u64,
    /// Requests cancelled while waiting, reported at the next step.
    ended: Vec<Event>,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, pool: BlockPool) -> Result<Scheduler, ScheduleError> {
        if config.max_running == 0 || config.step_tokens < config.max_running {
            return Err(ScheduleError::Invalid(format!(
                "a step of {} tokens for {} running sequences: the per-step token limit must \
                 hold one decode row of each",
                config.step_tokens, config.max_running
            )));
        }
        if let Some(r) = config.rings.filter(|r| r.runs < config.max_running) {
            return Err(ScheduleError::Invalid(format!(
                "{} ring runs for {} running sequences: every running sequence needs a ring",
                r.runs, config.max_running
            )));
        }
        Ok(Scheduler {
            free_slots: (0..config.max_running).rev().collect(),
            rings: config.rings.map(|r| RingRuns::new(r.runs, r.slack)),
            config,
            pool,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_id: 0,
            clock: 0,
            ended: Vec::new(),
        })
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Empties the pool's prefix cache (see [`BlockPool::drop_cache`]) and forgets the rings
    /// finished sequences left.
    pub fn drop_prefix_cache(&mut self) {
        self.pool.drop_cache();
        if let Some(rings) = &mut self.rings {
            rings.drop_cache();
        }
    }

    /// The ring run whose blocks slot `slot`'s ring tables are to name while its sequence
    /// runs (`None` without window rings, or for a slot no sequence runs in).
    pub fn ring_run(&self, slot: SeqId) -> Option<usize> {
        self.running.iter().find(|s| s.slot == Some(slot))?.run
    }

    /// Ring runs held by running sequences, and those finished sequences left cached
    /// (`(0, 0)` without window rings).
    pub fn ring_runs(&self) -> (usize, usize) {
        self.rings.as_ref().map_or((0, 0), RingRuns::counts)
    }

    /// Requests not finished yet (running or waiting).
    pub fn pending(&self) -> usize {
        self.waiting.len() + self.running.len()
    }

    /// Requests waiting for a sequence (new, or preempted to be recomputed).
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Requests holding a sequence.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// The block table of the sequence running in context slot `slot`.
    pub fn blocks(&self, slot: SeqId) -> Option<&[Option<BlockId>]> {
        self.running
            .iter()
            .find(|s| s.slot == Some(slot))
            .map(|s| s.blocks.blocks())
    }

    /// Each running sequence's blocks and bytes, oldest first.
    pub fn usage(&self) -> Vec<SequenceUsage> {
        let bytes_per_block = self.pool.stats().bytes_per_block;
        self.running
            .iter()
            .filter_map(|s| {
                let blocks = s.blocks.held();
                Some(SequenceUsage {
                    id: s.id,
                    slot: s.slot?,
                    positions: s.computed,
                    blocks,
                    bytes: blocks as u64 * bytes_per_block,
                })
            })
            .collect()
    }

    /// Queues `request`; it is refused when it could never fit the KV budget, even alone.
    pub fn submit(&mut self, request: Request) -> Result<RequestId, ScheduleError> {
        if request.prompt.is_empty() || request.max_new == 0 {
            return Err(ScheduleError::Invalid(
                "a request needs a prompt of at least one token and at least one new token".into(),
            ));
        }
        // Its last token is sampled, not stored, so it needs one position less.
        let positions = (request.prompt.len() + request.max_new)
            .saturating_sub(1)
            .clamp(request.prompt.len(), self.config.max_positions.max(1));
        if request.prompt.len() > self.config.max_positions {
            return Err(ScheduleError::Invalid(format!(
                "a prompt of {} tokens in a context of {} positions",
                request.prompt.len(),
                self.config.max_positions
            )));
        }
        let stats = self.pool.stats();
        let blocks = self.pool.blocks_for(positions);
        if blocks > stats.budget_blocks {
            return Err(ScheduleError::NeverFits {
                tokens: positions,
                needed_bytes: blocks as u64 * stats.bytes_per_block,
                budget_bytes: stats.budget_blocks as u64 * stats.bytes_per_block,
            });
        }
        let id = RequestId(self.next_id);
        self.next_id += 1;
        self.waiting.push_back(Sequence {
            id,
            tokens: request.prompt.clone(),
            request,
            generated: 0,
            computed: 0,
            blocks: SeqBlocks::default(),
            slot: None,
            run: None,
            admitted: 0,
            cancelled: false,
            failed: false,
        });
        Ok(id)
    }

    /// Cancels a request: it leaves at the next step, and its blocks are free after it.
    pub fn cancel(&mut self, id: RequestId) {
        if let Some(s) = self
            .running
            .iter_mut()
            .chain(self.waiting.iter_mut())
            .find(|s| s.id == id)
        {
            s.cancelled = true;
        }
    }

    /// Ends a request whose step failed (an error of the step, or non-finite logits of its
    /// row): it leaves at the next step like a cancelled one, the token of its row in that
    /// step's [`Scheduler::finish_step`] is dropped, and its blocks go back without entering
    /// the prefix cache, so no later prompt starts from keys and values the failure wrote.
    pub fn fail(&mut self, id: RequestId) {
        if let Some(s) = self
            .running
            .iter_mut()
            .chain(self.waiting.iter_mut())
            .find(|s| s.id == id)
        {
            s.cancelled = true;
            s.failed = true;
            // Its full blocks entered the prefix index as they were written (finish_step).
            self.pool.unregister(&s.blocks);
        }
    }

    /// Takes a running sequence out: its blocks go back (its full blocks into the prefix
    /// cache), its ring run too (cached with the tokens it holds, unless its step failed) and
    /// its slot is free.
    fn retire(&mut self, index: usize) -> Sequence {
        let mut s = self.running.remove(index);
        let blocks = std::mem::take(&mut s.blocks);
        self.pool.release(blocks);
        if let (Some(rings), Some(run)) = (&mut self.rings, s.run.take()) {
            let keep = self.config.prefix_cache && !s.failed;
            rings.release(run, keep.then(|| &s.tokens[..s.computed]));
        }
        if let Some(slot) = s.slot.take() {
            self.free_slots.push(slot);
        }
        s
    }

    /// Preempts running sequence `index`: what it computed goes into the prefix cache (so its
    /// recomputation may find it there), its blocks back to the pool, and it waits at the head
    /// of the queue to be recomputed from its tokens so far.
    fn preempt(&mut self, index: usize, plan: &mut StepPlan) {
        if self.config.prefix_cache {
            let s = &mut self.running[index];
            let computed = s.tokens[..s.computed].to_vec();
            self.pool.register(&mut s.blocks, &computed);
        }
        // Its `computed` is set again at admission, from what the prefix cache still holds.
        let s = self.retire(index);
        plan.preempted.push(s.id);
        self.waiting.push_front(s);
    }

    /// The most recently admitted running sequence after position `after` in the running list.
    fn youngest_after(&self, after: usize) -> Option<usize> {
        (after + 1..self.running.len()).max_by_key(|&i| self.running[i].admitted)
    }

    /// The next step (empty when nothing can run).
    pub fn plan_step(&mut self) -> StepPlan {
        let mut plan = StepPlan::default();
        // Cancelled requests leave now.
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].cancelled {
                // What it computed is as good as any prompt's: a client that asks again (or
                // goes on from where it stopped) finds it in the prefix cache.
                if self.config.prefix_cache && !self.running[i].failed {
                    let s = &mut self.running[i];
                    let computed = s.tokens[..s.computed].to_vec();
                    self.pool.register(&mut s.blocks, &computed);
                }
                let s = self.retire(i);
                self.ended.push(Event::Finished {
                    id: s.id,
                    reason: Finish::Cancelled,
                });
            } else {
                i += 1;
            }
        }
        let ended = &mut self.ended;
        self.waiting.retain(|s| {
            if s.cancelled {
                ended.push(Event::Finished {
                    id: s.id,
                    reason: Finish::Cancelled,
                });
            }
            !s.cancelled
        });
        let mut budget = self.config.step_tokens;
        // Decode rows, oldest first; a full pool preempts the youngest sequence after this one.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            if self.running[i].to_prefill() != 1 || self.running[i].generated == 0 {
                i += 1;
                continue;
            }
            match self.grow(i, 1, &mut plan) {
                Some(()) => {
                    self.push_rows(i, 1, RowKind::Decode, &mut plan);
                    budget -= 1;
                    i += 1;
                }
                // The youngest after it goes, or, when it is the youngest, itself.
                None => match self.youngest_after(i) {
                    Some(victim) => self.preempt(victim, &mut plan),
                    None => self.preempt(i, &mut plan),
                },
            }
        }
        // Prompt chunks of running sequences, oldest first: their blocks were taken whole at
        // admission, so a chunk never waits for the pool.
        for i in 0..self.running.len() {
            let s = &self.running[i];
            if budget == 0 || (s.generated > 0 && s.to_prefill() == 1) {
                continue;
            }
            let n = s.to_prefill().min(budget);
            self.push_rows(i, n, RowKind::Prefill, &mut plan);
            budget -= n;
        }
        // New sequences, first come first served, while a slot and the whole prompt fit.
        while budget > 0 && !self.free_slots.is_empty() {
            let Some(front) = self.waiting.front() else {
                break;
            };
            let mut found = if self.config.prefix_cache {
                self.pool
                    .lookup(&front.tokens, front.tokens.len().saturating_sub(1))
            } else {
                SeqBlocks::default()
            };
            // With window rings, the found prefix counts only as far as a cached ring holds
            // the window before its end.
            let mut ring_hit = None;
            if let Some(rings) = &self.rings {
                ring_hit = rings.find(&front.tokens, found.len(), self.pool.block_len());
                let len = ring_hit.map_or(0, |h| h.len);
                self.pool.truncate(&mut found, len);
            }
            let need = self.pool.blocks_for(front.tokens.len()) - found.held();
            if !self.pool.can_take(need) {
                self.pool.release(std::mem::take(&mut found));
                break;
            }
            let Some(mut s) = self.waiting.pop_front() else {
                break;
            };
            s.computed = found.len();
            s.blocks = found;
            // The whole prompt's blocks now (checked above), so its later chunks never wait.
            match self.pool.reserve(&mut s.blocks, s.tokens.len()) {
                Ok(copies) => plan.copies.extend(copies),
                Err(_) => {
                    self.pool.release(std::mem::take(&mut s.blocks));
                    self.waiting.push_front(s);
                    break;
                }
            }
            s.slot = self.free_slots.pop();
            if let Some(rings) = &mut self.rings {
                // A free slot means a run not held: there are as many as slots or more.
                s.run = rings.take(ring_hit);
            }
            if let Some(slot) = s.slot {
                plan.started.push((slot, s.tokens[..s.computed].to_vec()));
                plan.admitted.push(s.id);
            }
            self.clock += 1;
            s.admitted = self.clock;
            self.running.push(s);
            let i = self.running.len() - 1;
            let n = self.running[i].to_prefill().min(budget);
            self.push_rows(i, n, RowKind::Prefill, &mut plan);
            budget -= n;
        }
        plan
    }

    /// Room for `n` more positions of running sequence `i`; `None` when the pool is full.
    fn grow(&mut self, i: usize, n: usize, plan: &mut StepPlan) -> Option<()> {
        let s = &mut self.running[i];
        let len = s.computed + n;
        match self.pool.reserve(&mut s.blocks, len) {
            Ok(copies) => {
                plan.copies.extend(copies);
                Some(())
            }
            Err(PoolError::Full { .. }) | Err(PoolError::Invalid(_)) => None,
        }
    }

    /// The rows of running sequence `i`'s next `n` positions; its last row samples when it
    /// completes what must be computed before the next token.
    fn push_rows(&mut self, i: usize, n: usize, kind: RowKind, plan: &mut StepPlan) {
        let s = &mut self.running[i];
        let Some(slot) = s.slot else {
            return;
        };
        for k in 0..n {
            let pos = s.computed + k;
            let output = if pos + 1 == s.tokens.len() {
                RowOutput::Sample(s.request.sampler)
            } else {
                RowOutput::Nothing
            };
            plan.batch.push(BatchRow {
                seq: slot,
                pos,
                token: s.tokens[pos],
                kind,
                output,
            });
            plan.requests.push(s.id);
        }
        s.computed += n;
    }

    /// Takes the tokens sampled for `plan`'s rows (in the order of the rows that asked) and
    /// returns what happened: new tokens and finished requests.
    pub fn finish_step(&mut self, plan: &StepPlan, sampled: &[u32]) -> Vec<Event> {
        let mut events = std::mem::take(&mut self.ended);
        // What the step wrote is in the pool now: the running sequences' full blocks go into
        // the prefix index at once, so a request admitted while they still run starts from
        // them too. They are shared by reference count, and a full block is never written
        // again (a lookup gives whole blocks only, short of the prompt's last position).
        if self.config.prefix_cache {
            for s in self.running.iter_mut().filter(|s| !s.cancelled) {
                self.pool.register(&mut s.blocks, &s.tokens[..s.computed]);
            }
        }
        let asked = plan.batch.output_rows().map(|r| plan.requests[r]);
        for (id, &token) in asked.zip(sampled) {
            let Some(i) = self.running.iter().position(|s| s.id == id) else {
                continue;
            };
            let s = &mut self.running[i];
            // A failed or cancelled request's row has no token worth keeping (a failed row's
            // is a placeholder); it leaves at the next plan.
            if s.cancelled {
                continue;
            }
            s.tokens.push(token);
            s.generated += 1;
            events.push(Event::Token { id, token });
            let reason = if s.request.stop.contains(&token) {
                Some(Finish::Stop)
            } else if s.generated >= s.request.max_new {
                Some(Finish::TokenLimit)
            } else if s.tokens.len() > self.config.max_positions {
                Some(Finish::ContextFull)
            } else {
                None
            };
            if let Some(reason) = reason {
                // Every written position goes into the prefix cache, the generated ones
                // too: a conversation's next turn repeats the answer after the prompt.
                if self.config.prefix_cache {
                    let tokens = s.tokens[..s.computed].to_vec();
                    self.pool.register(&mut self.running[i].blocks, &tokens);
                }
                self.retire(i);
                events.push(Event::Finished { id, reason });
            }
        }
        events
    }
}
