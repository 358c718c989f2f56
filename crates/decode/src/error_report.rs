//! How the workspace's programs print an error: `error:` and `caused by:` lines, exit status 1,
//! never anyhow's debug form, which adds a backtrace whenever `RUST_BACKTRACE` is set and says
//! nothing useful about a missing file, a bad flag or a refused batch.

use std::process::ExitCode;

/// The error and its causes, one per line. A cause whose text the line above already
/// includes is left out.
pub fn report(e: &anyhow::Error) -> String {
    let mut out = format!("error: {e}\n");
    let mut shown = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !shown.contains(&text) {
            out.push_str(&format!("caused by: {text}\n"));
        }
        shown = text;
    }
    out
}

/// A program's exit: success, or the error printed by [`report`] to stderr and status 1.
pub fn exit(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprint!("{}", report(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_follow_the_error_once_each() {
        let e = anyhow::anyhow!("the disk is full")
            .context("writing the trace")
            .context("bench: B = 2");
        assert_eq!(
            report(&e),
            "error: bench: B = 2\ncaused by: writing the trace\ncaused by: the disk is full\n"
        );
        let repeated = anyhow::anyhow!("bad value").context("reading X: bad value");
        assert_eq!(report(&repeated), "error: reading X: bad value\n");
    }
}
