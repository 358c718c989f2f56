//! `cargo xtask replay TRACE --profile gfx1151 [--limits trace|default|none]`: replays an
//! allocation trace on a simulated device and prints, for each limits setting, the peaks
//! (reserved, allocated, cached, per tag), the device calls and whether the run fits.
//!
//! The trace comes from `bench-decode --alloc-trace FILE`, `Allocator::write_trace`, or a
//! generator (the committed ones are under `crates/rocm-alloc/tests/traces/`). The format and
//! the simulation are described in `docs/memory.md`, "Replaying a trace on another machine's
//! memory".

use anyhow::{Context, Result};
use rocm_alloc::devices::sim::DeviceProfile;
use rocm_alloc::replay::{self, LimitsMode, Progress};
use rocm_alloc::trace::TraceFile;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Replays do not print progress unless they run this long.
const QUIET_FOR: Duration = Duration::from_secs(2);

/// Events a replay takes unless `--max-events` allows more: over a hundred times the largest
/// committed trace's (404,596, `chat-8b-eager.jsonl`). A few hundred bytes of `repeat` lines
/// can expand to billions, hours of replay.
const DEFAULT_MAX_EVENTS: u64 = 50_000_000;

#[derive(clap::Args)]
pub struct Args {
    /// The trace file.
    trace: PathBuf,
    /// The device to simulate: gfx1151 (Strix Halo, 96 GiB carve-out), gfx1151-gtt (512 MiB
    /// carve-out, 120 GiB GTT) or discrete-16g (16 GiB card).
    #[arg(long, default_value = "gfx1151")]
    profile: DeviceProfile,
    /// Limits of the replaying allocator: trace (the trace's own), default (what the
    /// allocator picks on that device) or none; repeat for more columns. Default: default and
    /// none side by side.
    #[arg(long, value_name = "LIMITS")]
    limits: Vec<LimitsMode>,
    /// The most events the trace may expand to (its `repeat` lines counted); a longer one is
    /// refused before it starts.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_EVENTS)]
    max_events: u64,
}

/// Refuses a replay of more than `max` events, saying how to allow it.
fn check_work(events: u64, max: u64) -> Result<()> {
    if events > max {
        anyhow::bail!(
            "the trace expands to {events} events through its repeat lines, more than \
             --max-events {max}; pass --max-events {events} to replay it all"
        );
    }
    Ok(())
}

pub fn run(args: Args) -> Result<()> {
    let trace = TraceFile::read_path(&args.trace)
        .with_context(|| format!("reading the trace {}", args.trace.display()))?;
    let modes = if args.limits.is_empty() {
        vec![LimitsMode::Default, LimitsMode::None]
    } else {
        args.limits.clone()
    };
    let events = trace.expanded_len()?;
    check_work(events, args.max_events)?;
    let h = &trace.header;
    let mut header = format!("trace:   {}\n", args.trace.display());
    header += &format!(
        "         {} events ({} lines), recorded on {}\n",
        events, h.events, h.device.name
    );
    if let Some(note) = &h.note {
        header += &format!("         {note}\n");
    }
    header += &format!(
        "device:  {}: {}\n\n",
        args.profile.name(),
        args.profile.description()
    );
    write_stdout(&header)?;
    let mut reports = Vec::new();
    for mode in modes {
        let started = Instant::now();
        let mut shown = false;
        let mut progress = |p: Progress| {
            if started.elapsed() >= QUIET_FOR {
                eprint!(
                    "\rreplaying under {mode} limits: {} of {} events",
                    p.done, p.total
                );
                let _ = std::io::stderr().flush();
                shown = true;
            }
        };
        let device = format!("{}: {}", args.profile.name(), args.profile.description());
        let report = replay::replay_on(
            &trace,
            args.profile.config(),
            device,
            mode,
            Some(&mut progress),
        )
        .with_context(|| format!("replaying {} under {mode} limits", args.trace.display()))?;
        if shown {
            eprintln!();
        }
        reports.push(report);
    }
    write_stdout(&replay::table(&reports))
}

/// Writes to standard output as command line tools do: a reader that went away (`| head`)
/// ends the program quietly with the status a SIGPIPE gives (141), and any other failure (a
/// full disk) is an error that names standard output, never `print!`'s panic.
fn write_stdout(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(141),
        Err(e) => Err(e).context("writing to standard output"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed(name: &str) -> PathBuf {
        crate::workspace_root()
            .join("crates/rocm-alloc/tests/traces")
            .join(name)
    }

    #[test]
    fn a_trace_longer_than_the_bound_is_refused_before_it_runs() {
        let trace = committed("chat-8b-eager.jsonl");
        let events = TraceFile::read_path(&trace)
            .unwrap()
            .expanded_len()
            .unwrap();
        assert!(events > 100 && events <= DEFAULT_MAX_EVENTS, "{events}");
        let args = |max_events| Args {
            trace: trace.clone(),
            profile: "gfx1151".parse().unwrap(),
            limits: vec![LimitsMode::None],
            max_events,
        };
        let e = run(args(100)).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{events} events")) && e.contains("--max-events"),
            "{e}"
        );
        run(args(events)).unwrap();
    }
}
