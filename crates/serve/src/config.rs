//! What `hipdecode serve` is told: where to listen, who may ask, and the bounds on requests.

use std::time::Duration;

/// The server's settings (the model's come with [`crate::LoadedModel`]).
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The address to bind; 127.0.0.1 unless the user opens it up.
    pub host: String,
    /// 0 lets the OS pick one (the bound port is printed).
    pub port: u16,
    /// When set, `/v1/*` and `/metrics` need `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Bodies above this many bytes get 413.
    pub max_body: usize,
    /// Requests that may wait for a sequence beyond those running; one more gets 503.
    pub max_queue: usize,
    /// A request's deadline from its arrival (queued and running together).
    pub timeout: Duration,
    /// After SIGINT or SIGTERM, how long running requests may go on before they are cut.
    pub shutdown_timeout: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            max_body: 1 << 20,
            max_queue: 64,
            timeout: Duration::from_secs(600),
            shutdown_timeout: Duration::from_secs(10),
        }
    }
}
