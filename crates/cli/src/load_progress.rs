//! The model load as a user sees it: a progress bar over the layers while a large model loads
//! (only where standard error is a terminal, so logs and pipes get no bar), then one line with
//! the time it took.

use decode::backend::Backend;
use decode::context::ContextOptions;
use decode::session::Session;
use decode::GgufFile;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Loads `file` onto `backend` as [`Session::load`] does, showing the bar on a terminal, and
/// returns the session with the time the load took.
pub fn load<B: Backend>(
    file: &Arc<GgufFile>,
    backend: B,
    options: ContextOptions,
) -> decode::Result<(Session<B>, Duration)> {
    let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "loading {bar:30} {pos}/{len} layers, {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let started = Instant::now();
    let loaded = Session::load_with_progress(file, backend, options, &mut |done, layers| {
        bar.set_length(layers as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    Ok((loaded?, started.elapsed()))
}

/// `0.42 s`, or `1.3 ms` below a tenth of a second.
pub fn seconds(d: Duration) -> String {
    if d < Duration::from_millis(100) {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}
