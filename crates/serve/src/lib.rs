//! `hipdecode serve`: an OpenAI-compatible HTTP server over decode's engine.
//!
//! - [`api`]: the wire format (request checks, response bodies and chunks, the error object);
//! - [`generation`]: one request's prompt made ready and its generation driven through the
//!   engine, with stop strings, the deadline and cancellation;
//! - [`http`]: the routes, the key check and the two response forms;
//! - [`metrics`]: `/metrics` in Prometheus text;
//! - [`server`]: binding, readiness and the shutdown;
//! - [`state`]: what the handlers share.
//!
//! The engine runs on the thread that owns the backend (the caller's); the server runs on a
//! tokio runtime of its own and reaches the engine through an
//! [`decode::engine::EngineHandle`]. Admission is bounded twice: the scheduler admits a
//! request only when the KV pool holds its prompt, and the server keeps at most the running
//! sequences plus `--max-queue` requests, answering 503 beyond.

pub mod api;
pub mod config;
pub mod generation;
pub mod http;
pub mod metrics;
pub mod server;
pub mod state;

pub use config::ServeConfig;
pub use server::{ServeError, Server};
pub use state::LoadedModel;

/// The README's examples, run as doc tests so the README stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
