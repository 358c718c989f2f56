//! Log events on standard error, for every command: `RUST_LOG` picks what is shown (as the
//! `tracing-subscriber` crate reads it), and without it `-v` raises the level from `warn` (or
//! `info` for `serve`) to `info`, `debug` and then `trace`. The libraries report kernel compiles
//! and cache hits, allocator growth and out-of-memory reports, and model loads as events.

use tracing_subscriber::EnvFilter;

/// Installs the subscriber: `RUST_LOG` when it is set, else `base` raised `verbose` levels.
pub fn init(verbose: u8, base: tracing::Level) {
    let levels = [
        tracing::Level::ERROR,
        tracing::Level::WARN,
        tracing::Level::INFO,
        tracing::Level::DEBUG,
        tracing::Level::TRACE,
    ];
    let at = levels.iter().position(|&l| l == base).unwrap_or(1);
    let level = levels[(at + usize::from(verbose)).min(levels.len() - 1)];
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(level.as_str().to_ascii_lowercase()));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
