//! The engine's side doors: what a request's owner receives ([`Update`]), where the engine
//! puts it ([`UpdateSink`], which may refuse when its reader lags), and the handles that submit
//! and cancel requests from other threads ([`EngineHandle`], [`RequestHandle`]).

use crate::error::{DecodeError, Result};
use crate::kv::PoolStats;
use crate::memory::MemoryReport;
use crate::scheduler::{Finish, Request, RequestId, SequenceUsage};
use std::sync::mpsc;

/// What a request's sink receives, in this order: `Started` once, a `Token` per token, then
/// one `Finished` or `Failed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Update {
    /// The request took a sequence; the first `cached` prompt positions were found in the
    /// prefix cache and are not computed again.
    Started {
        cached: usize,
    },
    Token(u32),
    Finished {
        reason: Finish,
        /// The most KV-pool bytes its sequence held at once.
        peak_kv_bytes: u64,
    },
    /// The step the request was in failed, or the engine stopped; the request is over.
    Failed(String),
}

/// What became of an update handed to a sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    Delivered,
    /// The reader is too far behind: the engine cancels the request rather than wait for it.
    Full,
    /// Nobody reads any more: the engine cancels the request.
    Closed,
}

/// Where the engine puts a request's updates. It must never block: the step loop calls it
/// between steps for every running request.
pub trait UpdateSink: Send {
    fn deliver(&mut self, update: Update) -> Delivery;
}

/// An unbounded channel: never full.
impl UpdateSink for mpsc::Sender<Update> {
    fn deliver(&mut self, update: Update) -> Delivery {
        match self.send(update) {
            Ok(()) => Delivery::Delivered,
            Err(_) => Delivery::Closed,
        }
    }
}

/// A bounded channel: full when its reader lags by its capacity.
impl UpdateSink for mpsc::SyncSender<Update> {
    fn deliver(&mut self, update: Update) -> Delivery {
        match self.try_send(update) {
            Ok(()) => Delivery::Delivered,
            Err(mpsc::TrySendError::Full(_)) => Delivery::Full,
            Err(mpsc::TrySendError::Disconnected(_)) => Delivery::Closed,
        }
    }
}

/// The engine's books at one moment: the KV pool, each running sequence's share of it, the
/// queue, and the backend's memory.
#[derive(Clone, Debug)]
pub struct EngineStats {
    pub pool: PoolStats,
    /// Blocks of the pool with memory behind them: a shared pool's storage grows as blocks
    /// are handed out ([`crate::context::Context::kv_backed_blocks`]).
    pub backed_blocks: usize,
    /// Running sequences, oldest first.
    pub sequences: Vec<SequenceUsage>,
    /// Requests waiting for a sequence.
    pub waiting: usize,
    /// Window-layer rings that finished sequences left for the prefix cache (they are the
    /// free sequence slots' own storage, so they cost no memory of their own).
    pub ring_runs_cached: usize,
    /// Bytes in use per tag.
    pub memory: MemoryReport,
    /// The device allocator's counters (reserved, cached, per tag), on a backend with a
    /// device.
    pub device: Option<rocm_alloc::Stats>,
    /// The process's device memory as nvidia-smi or rocm-smi list it, context included
    /// ([`crate::memory::DeviceMemory::per_process`]), where the driver tells.
    pub device_process: Option<u64>,
    /// Steps of decode rows only, and steps that carried prompt rows.
    pub decode_steps: StepCounters,
    pub prefill_steps: StepCounters,
    /// Decode-step graphs the backend captured (`Backend::graphs_captured`): one per bucket of
    /// row counts that came up, or per row count with `HIPDECODE_GPU_GRAPH_ROWS=exact`.
    pub decode_graphs: usize,
}

/// Steps the engine ran since it started: how many, their rows, and the time they took.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepCounters {
    pub steps: u64,
    pub rows: u64,
    pub seconds: f64,
}

impl StepCounters {
    pub(super) fn add(&mut self, rows: usize, seconds: f64) {
        self.steps += 1;
        self.rows += rows as u64;
        self.seconds += seconds;
    }
}

pub(super) enum Command {
    Submit(
        Request,
        Box<dyn UpdateSink>,
        mpsc::Sender<Result<RequestId>>,
    ),
    Cancel(RequestId),
    Stats(mpsc::Sender<EngineStats>),
    Stop,
}

/// Submits and cancels requests of an engine from any thread; clones share the engine.
#[derive(Clone)]
pub struct EngineHandle {
    pub(super) commands: mpsc::Sender<Command>,
}

fn stopped() -> DecodeError {
    DecodeError::InvalidArgument("the engine has stopped".into())
}

impl EngineHandle {
    /// Queues a request whose updates go to `sink`. Refused when the scheduler refuses it (an
    /// empty prompt, no new tokens, a prompt longer than a sequence holds, more KV than the
    /// whole budget). Waits for the engine's answer, which comes between two steps.
    pub fn submit_to(&self, request: Request, sink: Box<dyn UpdateSink>) -> Result<RequestId> {
        let (reply, answer) = mpsc::channel();
        self.commands
            .send(Command::Submit(request, sink, reply))
            .map_err(|_| stopped())?;
        answer.recv().map_err(|_| stopped())?
    }

    /// Queues a request and returns the handle that reads its updates.
    pub fn submit(&self, request: Request) -> Result<RequestHandle> {
        let (tx, updates) = mpsc::channel();
        let id = self.submit_to(request, Box::new(tx))?;
        Ok(RequestHandle {
            id,
            updates,
            engine: self.clone(),
            ended: false,
        })
    }

    /// Cancels a request: it leaves at the engine's next step (its sink gets `Finished` with
    /// [`Finish::Cancelled`]). Unknown or finished ids are ignored.
    pub fn cancel(&self, id: RequestId) {
        // A stopped engine has nothing left to cancel.
        let _ = self.commands.send(Command::Cancel(id));
    }

    /// The engine's books now.
    pub fn stats(&self) -> Result<EngineStats> {
        let (reply, answer) = mpsc::channel();
        self.commands
            .send(Command::Stats(reply))
            .map_err(|_| stopped())?;
        answer.recv().map_err(|_| stopped())
    }

    /// Stops the engine after its current step; requests still there end as failed.
    pub fn stop(&self) {
        let _ = self.commands.send(Command::Stop);
    }
}

/// A submitted request: its updates as they come, and its cancellation. Dropped before its
/// request ends, it cancels it.
pub struct RequestHandle {
    id: RequestId,
    updates: mpsc::Receiver<Update>,
    engine: EngineHandle,
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
        if !matches!(update, Some(Update::Token(_) | Update::Started { .. })) {
            self.ended = true;
        }
        update
    }

    /// Cancels the request: it leaves at the engine's next step.
    pub fn cancel(&self) {
        self.engine.cancel(self.id);
    }

    /// Waits for the end: every token, and how it ended (`Started` is skipped).
    pub fn collect(mut self) -> (Vec<u32>, Update) {
        let mut tokens = Vec::new();
        loop {
            match self.next_update() {
                Some(Update::Token(t)) => tokens.push(t),
                Some(Update::Started { .. }) => {}
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
