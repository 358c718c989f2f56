//! The engine: a model, its context and backend on a thread of their own, running the
//! scheduler's steps while requests arrive from other threads. [`Engine::submit`] returns a
//! [`RequestHandle`] that streams the request's tokens and can cancel it; a handle dropped
//! before its request ends cancels it too. A step that fails ends the requests in it with the
//! error; the engine goes on with the others, so no request can stop it.

use crate::backend::Backend;
use crate::context::Context;
use crate::error::{DecodeError, Result};
use crate::kv::{BlockPool, PoolStats};
use crate::model::Model;
use crate::scheduler::{
    Event, Finish, Request, RequestId, Scheduler, SchedulerConfig, SequenceUsage, StepPlan,
};
use std::collections::HashMap;
use std::sync::mpsc;
use std::thread::JoinHandle;

/// Runs `plan` through `ctx`: the sequences that start in this step are restarted in their
/// slots (at the prefix their blocks already hold), every sequence of the step gets the blocks
/// `scheduler` gave it, shared blocks the step writes are copied first, then the step runs.
/// Returns the sampled tokens in the order of the rows that asked.
pub fn run_plan<B: Backend>(
    model: &Model<B>,
    backend: &mut B,
    ctx: &mut Context<B>,
    scheduler: &Scheduler,
    plan: &StepPlan,
) -> Result<Vec<u32>> {
    for (seq, prefix) in &plan.started {
        ctx.start(*seq, prefix)?;
    }
    if plan.batch.is_empty() {
        return Ok(Vec::new());
    }
    let mut seen = Vec::new();
    for &seq in plan.batch.sequences() {
        if seen.contains(&seq) {
            continue;
        }
        seen.push(seq);
        let blocks = scheduler.blocks(seq).unwrap_or_default();
        ctx.set_blocks(seq, blocks.iter().map(|b| b.map(|id| id.0)))?;
    }
    let copies: Vec<(usize, usize)> = (plan.copies.iter())
        .map(|c| (c.from.index(), c.to.index()))
        .collect();
    ctx.copy_blocks(backend, &copies)?;
    let sampled = model.step(backend, ctx, &plan.batch)?;
    Ok(sampled.into_iter().map(|s| s.token).collect())
}

/// The scheduler over a context's paged KV storage: its pool is the context's pool of blocks
/// (the full-context layers'), so the blocks it hands out are the storage the steps write. A
/// block's bytes are those layers' share of the context's KV bytes; the window layers' rings
/// are each sequence's own and outside the pool. The prefix cache is on when every layer is in
/// the pool (a ring holds only a window of a prefix's keys, so a found prefix would lack them).
pub fn scheduler_for<B: Backend>(ctx: &Context<B>) -> Result<Scheduler> {
    let plan = ctx.kv_plan();
    let max_batch = ctx.options().max_batch;
    let running = ctx.sequences().min(max_batch);
    let invalid = |e: &dyn std::fmt::Display| DecodeError::InvalidArgument(e.to_string());
    // Rows of storage of every layer, and of the pool's layers: their share of the bytes.
    let (mut all_rows, mut pool_rows) = (0u128, 0u128);
    for il in 0..plan.slots.len() {
        let rows = plan.rows(il)? as u128;
        all_rows += rows;
        if plan.groups[il] == crate::kv::KvGroup::POOL {
            pool_rows += rows;
        }
    }
    let pool_bytes = (ctx.kv_bytes() as u128 * pool_rows / all_rows.max(1)) as u64;
    let blocks = plan.pool_blocks as u64;
    let bytes_per_block = pool_bytes.div_ceil(blocks.max(1)).max(1);
    let pool = BlockPool::new(
        plan.block,
        bytes_per_block,
        blocks * bytes_per_block,
        plan.pool_slots / plan.block,
    )
    .map_err(|e| invalid(&e))?;
    let config = SchedulerConfig {
        max_running: running,
        step_tokens: max_batch,
        max_positions: ctx.capacity(),
        prefix_cache: plan.ring_slots.is_empty(),
    };
    Scheduler::new(config, pool).map_err(|e| invalid(&e))
}

/// The KV books of an engine: the pool, and what each running sequence holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvUsage {
    pub pool: PoolStats,
    pub sequences: Vec<SequenceUsage>,
}

/// What a handle receives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Update {
    Token(u32),
    Finished(Finish),
    /// The step the request was in failed; the request is over.
    Failed(String),
}

enum Command {
    Submit(Request, mpsc::Sender<Result<RequestHandleParts>>),
    Cancel(RequestId),
    Stats(mpsc::Sender<KvUsage>),
    Shutdown,
}

struct RequestHandleParts {
    id: RequestId,
    updates: mpsc::Receiver<Update>,
}

/// A submitted request: its updates as they come, and its cancellation.
pub struct RequestHandle {
    id: RequestId,
    updates: mpsc::Receiver<Update>,
    commands: mpsc::Sender<Command>,
    ended: bool,
}

impl RequestHandle {
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next update, waiting for it; `None` once the request has ended.
    pub fn next_update(&mut self) -> Option<Update> {
        if self.ended {
            return None;
        }
        let update = self.updates.recv().ok();
        if !matches!(update, Some(Update::Token(_))) {
            self.ended = true;
        }
        update
    }

    /// Cancels the request: it leaves at the engine's next step.
    pub fn cancel(&self) {
        // A stopped engine has nothing left to cancel.
        let _ = self.commands.send(Command::Cancel(self.id));
    }

    /// Waits for the end: every token, and how it ended.
    pub fn collect(mut self) -> (Vec<u32>, Update) {
        let mut tokens = Vec::new();
        loop {
            match self.next_update() {
                Some(Update::Token(t)) => tokens.push(t),
                Some(end) => return (tokens, end),
                None => return (tokens, Update::Failed("the engine stopped".into())),
            }
        }
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        if !self.ended {
            self.cancel();
        }
    }
}

/// A model serving requests on its own thread.
pub struct Engine {
    commands: mpsc::Sender<Command>,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    /// Starts the engine's thread over `model`, `ctx` and the `backend` they live on.
    pub fn start<B: Backend + 'static>(
        model: Model<B>,
        backend: B,
        ctx: Context<B>,
    ) -> Result<Engine>
    where
        Model<B>: Send,
        Context<B>: Send,
    {
        let scheduler = scheduler_for(&ctx)?;
        let (commands, inbox) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("hipdecode-engine".into())
            .spawn(move || serve(model, backend, ctx, scheduler, inbox))
            .map_err(|e| DecodeError::InvalidArgument(format!("starting the engine: {e}")))?;
        Ok(Engine {
            commands,
            thread: Some(thread),
        })
    }

    /// Queues a request; refused when the scheduler refuses it (an empty prompt, no new
    /// tokens, a prompt longer than a sequence holds).
    pub fn submit(&self, request: Request) -> Result<RequestHandle> {
        let (reply, answer) = mpsc::channel();
        let stopped = || DecodeError::InvalidArgument("the engine has stopped".into());
        self.commands
            .send(Command::Submit(request, reply))
            .map_err(|_| stopped())?;
        let parts = answer.recv().map_err(|_| stopped())??;
        Ok(RequestHandle {
            id: parts.id,
            updates: parts.updates,
            commands: self.commands.clone(),
            ended: false,
        })
    }

    /// The scheduler's block pool and each running sequence's share of it, now.
    pub fn kv_usage(&self) -> Result<KvUsage> {
        let (reply, answer) = mpsc::channel();
        let stopped = || DecodeError::InvalidArgument("the engine has stopped".into());
        self.commands
            .send(Command::Stats(reply))
            .map_err(|_| stopped())?;
        answer.recv().map_err(|_| stopped())
    }
}

impl Drop for Engine {
    /// Stops the thread after its current step; requests still running end as failed.
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The engine's loop: take commands (waiting for one when idle), plan a step, run it, send the
/// updates.
fn serve<B: Backend>(
    model: Model<B>,
    mut backend: B,
    mut ctx: Context<B>,
    mut scheduler: Scheduler,
    inbox: mpsc::Receiver<Command>,
) {
    let mut senders: HashMap<RequestId, mpsc::Sender<Update>> = HashMap::new();
    // A step that ran nothing and reported nothing: wait for a command rather than spin.
    let mut stalled = false;
    loop {
        let idle = scheduler.pending() == 0 || stalled;
        let first = if idle {
            match inbox.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            }
        } else {
            None
        };
        for command in first
            .into_iter()
            .chain(inbox.try_iter().collect::<Vec<_>>())
        {
            match command {
                Command::Submit(request, reply) => match scheduler.submit(request) {
                    Ok(id) => {
                        let (tx, updates) = mpsc::channel();
                        senders.insert(id, tx);
                        if reply.send(Ok(RequestHandleParts { id, updates })).is_err() {
                            // The submitter is gone before it got its handle.
                            senders.remove(&id);
                            scheduler.cancel(id);
                        }
                    }
                    Err(e) => {
                        let _ = reply.send(Err(DecodeError::InvalidArgument(e.to_string())));
                    }
                },
                Command::Cancel(id) => scheduler.cancel(id),
                Command::Stats(reply) => {
                    let _ = reply.send(KvUsage {
                        pool: scheduler.pool().stats(),
                        sequences: scheduler.usage(),
                    });
                }
                Command::Shutdown => {
                    for (_, tx) in senders.drain() {
                        let _ = tx.send(Update::Failed("the engine stopped".into()));
                    }
                    return;
                }
            }
        }
        let plan = scheduler.plan_step();
        let sampled = match run_plan(&model, &mut backend, &mut ctx, &scheduler, &plan) {
            Ok(sampled) => sampled,
            Err(e) => {
                // The step's requests end with the error (they leave at the next step); the
                // others go on.
                for id in dedup(&plan.requests) {
                    scheduler.cancel(id);
                    if let Some(tx) = senders.remove(&id) {
                        let _ = tx.send(Update::Failed(e.to_string()));
                    }
                }
                for &slot in plan.batch.sequences() {
                    ctx.clear(slot);
                }
                Vec::new()
            }
        };
        // After a failed step no row has a token, so only earlier cancellations are reported.
        let events = scheduler.finish_step(&plan, &sampled);
        stalled = plan.batch.is_empty() && events.is_empty();
        for event in events {
            match event {
                Event::Token { id, token } => {
                    let gone = senders
                        .get(&id)
                        .is_some_and(|tx| tx.send(Update::Token(token)).is_err());
                    if gone {
                        // Its handle was dropped: nobody waits for it.
                        senders.remove(&id);
                        scheduler.cancel(id);
                    }
                }
                Event::Finished { id, reason } => {
                    if let Some(tx) = senders.remove(&id) {
                        let _ = tx.send(Update::Finished(reason));
                    }
                }
            }
        }
    }
}

fn dedup(ids: &[RequestId]) -> Vec<RequestId> {
    let mut out = ids.to_vec();
    out.sort();
    out.dedup();
    out
}
