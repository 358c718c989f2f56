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
    let h = &trace.header;
    println!("trace:   {}", args.trace.display());
    println!(
        "         {} events ({} lines), recorded on {}",
        events, h.events, h.device.name
    );
    if let Some(note) = &h.note {
        println!("         {note}");
    }
    println!(
        "device:  {}: {}",
        args.profile.name(),
        args.profile.description()
    );
    println!();
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
    print!("{}", replay::table(&reports));
    Ok(())
}
