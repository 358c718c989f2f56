//! The engine: a model, its context and backend running the scheduler's steps while requests
//! arrive from other threads. [`run`] is the step loop on the calling thread (the thread that
//! owns the backend, for a backend that cannot move), fed through the [`EngineHandle`]s of
//! [`channel`]; [`Engine::start`] runs it on a thread of its own. A request's updates go to
//! its [`UpdateSink`]; a sink that is full or closed cancels its request, so a slow or gone
//! reader never holds up a step. A step that fails ends the requests in it with the error; the
//! engine goes on with the others, so no request can stop it.

mod handle;

pub use handle::{
    Delivery, EngineHandle, EngineStats, RequestHandle, StepCounters, Update, UpdateSink,
};

use crate::backend::Backend;
use crate::context::Context;
use crate::error::{DecodeError, Result};
use crate::kv::BlockPool;
use crate::model::Model;
use crate::scheduler::{
    Event, Request, RequestId, RingConfig, Scheduler, SchedulerConfig, StepPlan,
};
use handle::Command;
use std::collections::HashMap;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a server's engine waits idle before it empties the prefix cache and gives the KV
/// pool's memory back.
pub static KV_IDLE_RELEASE: knobs::Knob<Option<Duration>> = knobs::Knob {
    name: "HIPDECODE_KV_IDLE_RELEASE",
    default: "30",
    doc: "seconds a server waits with no request before it drops its prefix cache and gives \
          back the memory of a KV pool that grows (`HIPDECODE_GPU_KV_POOL=grow`); `off` keeps \
          both until blocks are needed",
    scope: knobs::Scope::Run,
    parse: |v| match v.trim() {
        "off" => Ok(None),
        t => match t.parse::<f64>() {
            Ok(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
            _ => Err("not a number of seconds; give e.g. 30, or `off`".into()),
        },
    },
};

/// Runs `plan` through `ctx`: the sequences that start in this step are restarted in their
/// slots (at the prefix their blocks already hold), every sequence of the step gets the blocks
/// `scheduler` gave it, shared blocks the step writes are copied first, then the step runs.
/// Returns a token for each row that asked, in row order, for
/// [`Scheduler::finish_step`], and the rows whose sequence failed (non-finite logits) with
/// the error: their requests are to be ended with [`Scheduler::fail`], which makes
/// `finish_step` drop the placeholder token their rows hold.
pub fn run_plan<B: Backend>(
    model: &Model<B>,
    backend: &mut B,
    ctx: &mut Context<B>,
    scheduler: &Scheduler,
    plan: &StepPlan,
) -> Result<PlanResults> {
    for (seq, prefix) in &plan.started {
        ctx.start(*seq, prefix)?;
        // Its window layers read the ring the scheduler gave it: a finished sequence's, when
        // the prefix came from that one.
        if let Some(run) = scheduler.ring_run(*seq) {
            ctx.set_ring_run(*seq, run)?;
        }
    }
    if plan.batch.is_empty() {
        return Ok(PlanResults::default());
    }
    let mut seen = Vec::new();
    for &seq in plan.batch.sequences() {
        if seen.contains(&seq) {
            continue;
        }
        seen.push(seq);
        let blocks = scheduler.blocks(seq).unwrap_or_default();
        ctx.set_blocks(backend, seq, blocks.iter().map(|b| b.map(|id| id.0)))?;
    }
    let copies: Vec<(usize, usize)> = (plan.copies.iter())
        .map(|c| (c.from.index(), c.to.index()))
        .collect();
    ctx.copy_blocks(backend, &copies)?;
    let results = model.step_rows(backend, ctx, &plan.batch)?;
    let mut sampled = results.sampled.into_iter().peekable();
    let mut tokens = Vec::new();
    for row in plan.batch.output_rows() {
        if !matches!(
            plan.batch.outputs()[row],
            crate::batch::RowOutput::Sample(_)
        ) {
            continue;
        }
        match sampled.next_if(|s| s.row == row) {
            Some(s) => tokens.push(s.token),
            // A failed row: it keeps its place so the rows after it keep theirs.
            None => tokens.push(0),
        }
    }
    Ok(PlanResults {
        tokens,
        failed: results.failed,
    })
}

/// What [`run_plan`] gives back.
#[derive(Debug, Default)]
pub struct PlanResults {
    /// A token per row that asked for one, in row order (a placeholder on a failed row).
    pub tokens: Vec<u32>,
    /// The rows whose sequences failed, each with its error.
    pub failed: Vec<(usize, DecodeError)>,
}

/// The scheduler over a context's paged KV storage: its pool is the context's pool of blocks
/// (the full-context layers'), so the blocks it hands out are the storage the steps write. A
/// block's bytes are those layers' share of the context's KV bytes; the window layers' rings
/// are outside the pool, a run of them per sequence slot, which the scheduler moves from a
/// finished sequence to one that goes on from its prefix (a ring holds only the window before
/// its end, which is all a window layer reads).
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
        prefix_cache: true,
        // Every ring holds `window + max_batch - 1` slots or more (`kv_plan`).
        rings: (!plan.ring_slots.is_empty()).then(|| RingConfig {
            runs: plan.sequences,
            slack: ctx.options().max_batch.saturating_sub(1),
        }),
    };
    Scheduler::new(config, pool).map_err(|e| invalid(&e))
}

/// [`KV_IDLE_RELEASE`] as the environment sets it. An invalid value was refused by the
/// program's start-up check; a library user gets the default, with a warning.
fn idle_release_setting() -> Option<Duration> {
    KV_IDLE_RELEASE.read().unwrap_or_else(|e| {
        tracing::warn!("{e}; the KV pool's memory is given back after 30 s idle");
        Some(Duration::from_secs(30))
    })
}

/// The step loop's end of an engine's commands.
pub struct EngineInbox {
    commands: mpsc::Receiver<Command>,
}

/// A new engine's handle and the inbox [`run`] takes.
pub fn channel() -> (EngineHandle, EngineInbox) {
    let (commands, inbox) = mpsc::channel();
    (EngineHandle { commands }, EngineInbox { commands: inbox })
}

/// A model serving requests on its own thread.
pub struct Engine {
    handle: EngineHandle,
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
        Engine::start_with_idle_release(model, backend, ctx, idle_release_setting())
    }

    /// [`Engine::start`], giving a growing KV pool's memory back after `idle_release` with
    /// no request (`None`: never) rather than after [`KV_IDLE_RELEASE`].
    pub fn start_with_idle_release<B: Backend + 'static>(
        model: Model<B>,
        backend: B,
        ctx: Context<B>,
        idle_release: Option<Duration>,
    ) -> Result<Engine>
    where
        Model<B>: Send,
        Context<B>: Send,
    {
        let scheduler = scheduler_for(&ctx)?;
        let (handle, inbox) = channel();
        let thread = std::thread::Builder::new()
            .name("hipdecode-engine".into())
            .spawn(move || step_loop(&model, backend, ctx, scheduler, inbox, idle_release))
            .map_err(|e| DecodeError::InvalidArgument(format!("starting the engine: {e}")))?;
        Ok(Engine {
            handle,
            thread: Some(thread),
        })
    }

    /// A handle for other threads.
    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }

    /// Queues a request (see [`EngineHandle::submit`]).
    pub fn submit(&self, request: Request) -> Result<RequestHandle> {
        self.handle.submit(request)
    }

    /// The engine's books now.
    pub fn stats(&self) -> Result<EngineStats> {
        self.handle.stats()
    }
}

impl Drop for Engine {
    /// Stops the thread after its current step; requests still running end as failed.
    fn drop(&mut self) {
        self.handle.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Runs the engine on this thread until [`EngineHandle::stop`], or until every handle (and
/// every request's handle) is dropped.
pub fn run<B: Backend>(
    model: &Model<B>,
    backend: B,
    ctx: Context<B>,
    inbox: EngineInbox,
) -> Result<()> {
    let scheduler = scheduler_for(&ctx)?;
    step_loop(
        model,
        backend,
        ctx,
        scheduler,
        inbox,
        idle_release_setting(),
    );
    Ok(())
}

/// A request the loop runs: where its updates go, and its books.
struct Tracked {
    sink: Box<dyn UpdateSink>,
    started: bool,
    peak_kv_bytes: u64,
}

/// The requests of a loop, by id.
#[derive(Default)]
struct Requests {
    by_id: HashMap<RequestId, Tracked>,
}

impl Requests {
    /// Hands `update` to the request's sink; a sink that refuses it cancels the request, which
    /// then gets nothing more. Returns whether it was delivered.
    fn deliver(&mut self, scheduler: &mut Scheduler, id: RequestId, update: Update) -> bool {
        let Some(t) = self.by_id.get_mut(&id) else {
            return false;
        };
        match t.sink.deliver(update) {
            Delivery::Delivered => true,
            Delivery::Full | Delivery::Closed => {
                self.by_id.remove(&id);
                scheduler.cancel(id);
                false
            }
        }
    }

    /// Ends a request with its last update.
    fn end(&mut self, id: RequestId, update: impl FnOnce(&Tracked) -> Update) {
        if let Some(mut t) = self.by_id.remove(&id) {
            let last = update(&t);
            t.sink.deliver(last);
        }
    }
}

/// The engine's loop: take commands (waiting for one when idle), plan a step, run it, send the
/// updates.
fn step_loop<B: Backend>(
    model: &Model<B>,
    mut backend: B,
    mut ctx: Context<B>,
    mut scheduler: Scheduler,
    inbox: EngineInbox,
    idle_release: Option<Duration>,
) {
    let mut requests = Requests::default();
    let (mut decode_steps, mut prefill_steps) = (StepCounters::default(), StepCounters::default());
    // A step that ran nothing and reported nothing: wait for a command rather than spin.
    let mut stalled = false;
    let mut busy_at = Instant::now();
    loop {
        if scheduler.pending() > 0 {
            busy_at = Instant::now();
        }
        let idle = scheduler.pending() == 0 || stalled;
        // A grown pool with memory behind it, on a server with nothing to do: after a while
        // idle (commands such as a metrics scrape do not count), the prefix cache goes and
        // the pool's memory is given back.
        let release_at = idle_release
            .filter(|_| scheduler.pending() == 0)
            .filter(|_| ctx.kv_pool_grows() && ctx.kv_backed_blocks() > 0)
            .map(|after| busy_at + after);
        let first = match (idle, release_at) {
            (false, _) => None,
            (true, None) => match inbox.commands.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            },
            (true, Some(at)) => {
                match inbox
                    .commands
                    .recv_timeout(at.saturating_duration_since(Instant::now()))
                {
                    Ok(c) => Some(c),
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        scheduler.drop_prefix_cache();
                        let end = scheduler.pool().occupied_end();
                        if let Err(e) = ctx.release_kv_blocks_from(&mut backend, end) {
                            tracing::warn!("giving back the idle KV pool's memory failed: {e}");
                            // Not again until the next burst.
                            busy_at = Instant::now() + Duration::from_secs(86_400);
                        }
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
        };
        let commands: Vec<Command> = first.into_iter().chain(inbox.commands.try_iter()).collect();
        for command in commands {
            match command {
                Command::Submit(request, sink, reply) => match scheduler.submit(request) {
                    Ok(id) => {
                        requests.by_id.insert(
                            id,
                            Tracked {
                                sink,
                                started: false,
                                peak_kv_bytes: 0,
                            },
                        );
                        if reply.send(Ok(id)).is_err() {
                            // The submitter is gone before it got its id.
                            requests.by_id.remove(&id);
                            scheduler.cancel(id);
                        }
                    }
                    Err(e) => {
                        let _ = reply.send(Err(DecodeError::InvalidArgument(e.to_string())));
                    }
                },
                Command::Cancel(id) => scheduler.cancel(id),
                Command::Stats(reply) => {
                    let device = backend.device_memory().and_then(|m| m.ok());
                    let _ = reply.send(EngineStats {
                        pool: scheduler.pool().stats(),
                        backed_blocks: ctx.kv_backed_blocks(),
                        sequences: scheduler.usage(),
                        waiting: scheduler.waiting(),
                        ring_runs_cached: scheduler.ring_runs().1,
                        memory: backend.memory(),
                        device_process: device.as_ref().and_then(|m| m.per_process.clone().ok()),
                        device: device.map(|m| m.stats),
                        decode_steps,
                        prefill_steps,
                        decode_graphs: backend.graphs_captured(),
                    });
                }
                Command::Stop => {
                    let ids: Vec<RequestId> = requests.by_id.keys().copied().collect();
                    for id in ids {
                        requests.end(id, |_| Update::Failed("the engine stopped".into()));
                    }
                    return;
                }
            }
        }
        let plan = scheduler.plan_step();
        for (&id, (_, prefix)) in plan.admitted.iter().zip(&plan.started) {
            let first = requests.by_id.get_mut(&id).is_some_and(|t| {
                let first = !t.started;
                t.started = true;
                first
            });
            if first {
                let cached = prefix.len();
                requests.deliver(&mut scheduler, id, Update::Started { cached });
            }
        }
        let step_start = std::time::Instant::now();
        let ran = run_plan(model, &mut backend, &mut ctx, &scheduler, &plan);
        if !plan.batch.is_empty() {
            let seconds = step_start.elapsed().as_secs_f64();
            match plan.batch.phase() {
                crate::batch::Phase::Decode => decode_steps.add(plan.batch.len(), seconds),
                crate::batch::Phase::Prefill => prefill_steps.add(plan.batch.len(), seconds),
            }
        }
        let sampled = match ran {
            Ok(results) => {
                // A row with non-finite logits ends its own request; the step's others go on.
                for (row, e) in results.failed {
                    let id = plan.requests[row];
                    tracing::error!("request {}: {e}", id.0);
                    scheduler.fail(id);
                    requests.end(id, |_| Update::Failed(e.to_string()));
                }
                results.tokens
            }
            Err(e) => {
                // The step's requests end with the error (they leave at the next step); the
                // others go on.
                for id in dedup(&plan.requests) {
                    scheduler.fail(id);
                    requests.end(id, |_| Update::Failed(e.to_string()));
                }
                for &slot in plan.batch.sequences() {
                    ctx.clear(slot);
                }
                Vec::new()
            }
        };
        // What each running sequence holds after the step: its request's peak.
        for u in scheduler.usage() {
            if let Some(t) = requests.by_id.get_mut(&u.id) {
                t.peak_kv_bytes = t.peak_kv_bytes.max(u.bytes);
            }
        }
        // After a failed step no row has a token, so only earlier cancellations are reported.
        let events = scheduler.finish_step(&plan, &sampled);
        stalled = plan.batch.is_empty() && events.is_empty();
        for event in events {
            match event {
                Event::Token { id, token } => {
                    requests.deliver(&mut scheduler, id, Update::Token(token));
                }
                Event::Finished { id, reason } => requests.end(id, |t| Update::Finished {
                    reason,
                    peak_kv_bytes: t.peak_kv_bytes,
                }),
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
