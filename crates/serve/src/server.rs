//! The server's life: bind, answer `/health` with 503 while the model loads, serve once it is
//! handed over, and shut down on SIGINT or SIGTERM (stop admitting, let running requests end
//! within the shutdown timeout, cut the rest, stop the engine).

use crate::config::ServeConfig;
use crate::state::{AppState, LoadedModel};
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::sync::Notify;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("starting the server's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot listen on {addr}: {source}; pick another --host/--port (--port 0 lets the OS choose)")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("the server failed: {0}")]
    Serve(std::io::Error),
}

/// A running server.
pub struct Server {
    state: Arc<AppState>,
    addr: SocketAddr,
    stop: Arc<Notify>,
    thread: JoinHandle<Result<(), ServeError>>,
}

impl Server {
    /// Binds the address and starts answering on a thread of its own.
    pub fn start(config: ServeConfig) -> Result<Server, ServeError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("hipdecode-http")
            .build()
            .map_err(ServeError::Runtime)?;
        let addr = format!("{}:{}", config.host, config.port);
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(&addr))
            .map_err(|source| ServeError::Bind {
                addr: addr.clone(),
                source,
            })?;
        let bound = listener
            .local_addr()
            .map_err(|source| ServeError::Bind { addr, source })?;
        let state = Arc::new(AppState::new(config));
        let stop = Arc::new(Notify::new());
        let thread = {
            let (state, stop) = (Arc::clone(&state), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("hipdecode-serve".into())
                .spawn(move || runtime.block_on(serve(listener, state, stop)))
                .map_err(ServeError::Runtime)?
        };
        Ok(Server {
            state,
            addr: bound,
            stop,
            thread,
        })
    }

    /// The address it listens on (the OS's port for `--port 0`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts answering generation requests with `model`.
    pub fn ready(&self, model: LoadedModel) {
        let _ = self.state.model.set(Arc::new(model));
    }

    /// Whether a shutdown has begun (a signal, or [`Server::stop`]).
    pub fn shutting_down(&self) -> bool {
        self.state.draining()
    }

    /// Begins the shutdown as a signal would.
    pub fn stop(&self) {
        self.stop.notify_one();
    }

    /// Waits until the server has shut down.
    pub fn wait(self) -> Result<(), ServeError> {
        self.thread.join().unwrap_or_else(|_| {
            Err(ServeError::Serve(std::io::Error::other(
                "its thread panicked",
            )))
        })
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    stop: Arc<Notify>,
) -> Result<(), ServeError> {
    let app = crate::http::router(Arc::clone(&state));
    let shutdown = {
        let state = Arc::clone(&state);
        async move {
            tokio::select! {
                _ = signal() => {}
                _ = stop.notified() => {}
            }
            drain(&state).await;
        }
    };
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(ServeError::Serve);
    if let Some(model) = state.model.get() {
        model.engine.stop();
    }
    served
}

/// SIGINT or SIGTERM.
async fn signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let terminate = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}

/// Stops admitting, waits for the running requests up to the shutdown timeout, then cuts
/// them and gives their last chunks a moment to be written.
async fn drain(state: &AppState) {
    state.start_draining();
    let timeout = state.config.shutdown_timeout;
    tracing::info!(
        "shutting down: {} requests in flight, {} s for them to finish",
        state.in_flight(),
        timeout.as_secs_f64()
    );
    let until = tokio::time::Instant::now() + timeout;
    while state.in_flight() > 0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if state.in_flight() > 0 {
        tracing::info!(
            "cutting {} requests at the shutdown timeout",
            state.in_flight()
        );
        state.cut_running();
        // They end at the engine's next step.
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        while state.in_flight() > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
