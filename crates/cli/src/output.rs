//! Standard output that fails as command-line tools do, instead of panicking.
//!
//! Rust's `print!` panics (status 101) when a write fails. Here a closed pipe (`hipdecode run
//! ... | head -c 10`) ends the program quietly with status 141, as a process killed by SIGPIPE
//! ends (what coreutils do), and any other failure (stdout on `/dev/full`) is an error naming
//! standard output, status 1. Every write of the command line to stdout goes through [`out!`]
//! or [`outln!`], which return that error to the caller's `?`.

use std::fmt;
use std::io::{ErrorKind, Write};

/// The status of a process that SIGPIPE ended (128 + 13), as a shell reports it.
pub const BROKEN_PIPE_STATUS: i32 = 141;

/// Writes `args` to standard output and flushes it; a closed pipe exits the process with
/// [`BROKEN_PIPE_STATUS`], any other failure is an error naming standard output.
pub fn write(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    let result = stdout.write_fmt(args).and_then(|()| stdout.flush());
    drop(stdout);
    settle(result)
}

fn settle(result: std::io::Result<()>) -> anyhow::Result<()> {
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::BrokenPipe => std::process::exit(BROKEN_PIPE_STATUS),
        Err(e) => Err(anyhow::anyhow!("writing to standard output: {e}")),
    }
}

/// `print!` that returns write errors (see the module docs): `out!("{x}")?`.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write(format_args!($($arg)*))
    };
}

/// `println!` that returns write errors (see the module docs): `outln!("{x}")?`.
macro_rules! outln {
    () => {
        $crate::output::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {out, outln};
