//! What the handlers share: the settings, the model once it is loaded, the metrics, the
//! admission count, and the shutdown signals.

use crate::config::ServeConfig;
use crate::metrics::Metrics;
use decode::chat_template::ChatTemplate;
use decode::engine::EngineHandle;
use decode::tokenizer::Tokenizer;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::sync::watch;

/// The model the server answers with, handed over once it is loaded.
pub struct LoadedModel {
    /// Its id in `/v1/models` and the responses.
    pub name: String,
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template, or why chat requests are refused (the model has none, say).
    pub template: Result<ChatTemplate, String>,
    pub engine: EngineHandle,
    /// Positions one sequence holds (`--ctx`).
    pub context: usize,
    /// Sequences that run at once (`--parallel`).
    pub sequences: usize,
    /// Bytes of the KV pool the scheduler admits requests against.
    pub kv_budget_bytes: u64,
    /// Bytes per token of that pool's layers.
    pub kv_bytes_per_token: u64,
}

/// The server's shared state.
pub struct AppState {
    pub config: ServeConfig,
    pub model: OnceLock<Arc<LoadedModel>>,
    pub metrics: Metrics,
    /// Requests admitted and not yet answered.
    in_flight: AtomicUsize,
    /// Set by SIGINT or SIGTERM: new requests get 503.
    draining: AtomicBool,
    /// Flips to `true` when the shutdown timeout ends: running requests end there.
    cut: watch::Sender<bool>,
}

impl AppState {
    pub fn new(config: ServeConfig) -> AppState {
        AppState {
            config,
            model: OnceLock::new(),
            metrics: Metrics::new(),
            in_flight: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            cut: watch::Sender::new(false),
        }
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// A receiver that sees the cut.
    pub fn cut_signal(&self) -> watch::Receiver<bool> {
        self.cut.subscribe()
    }

    /// Ends every running request now (the shutdown timeout is over).
    pub fn cut_running(&self) {
        self.cut.send_replace(true);
    }

    /// A place for one more request, when the running sequences and the queue have room:
    /// `capacity` is the sequences plus `--max-queue`.
    pub fn admit(self: &Arc<Self>, capacity: usize) -> Option<Admitted> {
        let taken = self
            .in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < capacity).then_some(n + 1)
            });
        taken.is_ok().then(|| Admitted(Arc::clone(self)))
    }
}

/// One admitted request's place; given back when dropped.
pub struct Admitted(Arc<AppState>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
