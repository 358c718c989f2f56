//! `cargo xtask`: project automation written as plain Rust.
//!
//! Each subcommand lives in its own module with its own arguments.

mod bindgen;
mod bundle;
mod cycles;
mod demo;
mod models;
#[cfg(test)]
mod msrv;
mod replay;
mod test;
mod verify_rocm;
mod workspace;

use anyhow::Result;
use clap::{Parser, Subcommand};
// Defined outside this file so that the subcommands, which this file dispatches to, do not
// import from it in turn (`cargo xtask cycles` would see a ring through every subcommand).
pub(crate) use workspace::workspace_root;

#[derive(Parser)]
#[command(name = "xtask", about = "hipdecode project automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The main job: fetch Gemma 3 270M and generate from a prompt on the best device.
    Demo(demo::Args),
    /// The README's test command: Python references, the test model, then every test.
    Test(test::Args),
    /// Print the platform and device, then run the whole test suite with a pass/fail summary.
    VerifyRocm(verify_rocm::Args),
    /// Build the test binaries and tools into a folder that runs without cargo (for the GPU machine).
    Bundle(bundle::Args),
    /// Regenerate hip-ffi's committed bindings from installed HIP headers (needs the `bindgen`
    /// feature: `cargo run -p xtask --features bindgen -- bindgen`).
    Bindgen(bindgen::Args),
    /// Download a known model and verify its checksum.
    FetchModel(models::FetchArgs),
    /// Write a synthetic model with real shapes and random quantized weights.
    SynthModel(models::SynthArgs),
    /// Replay an allocation trace on a simulated device (gfx1151, discrete-16g, ...): peaks and
    /// whether it fits, with the default limits and with none.
    Replay(replay::Args),
    /// List each crate's file-level import cycles; fail on any not in the allowlist (with its
    /// reason) in xtask/src/cycles.rs, and on allowlist entries that match no cycle.
    Cycles(cycles::Args),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Demo(args) => demo::run(args),
        Command::Test(args) => test::run(args),
        Command::VerifyRocm(args) => verify_rocm::run(args),
        Command::Bundle(args) => bundle::run(args),
        Command::Bindgen(args) => bindgen::run(args),
        Command::FetchModel(args) => models::fetch(args),
        Command::SynthModel(args) => models::synth(args),
        Command::Replay(args) => replay::run(args),
        Command::Cycles(args) => cycles::run(args),
    }
}
