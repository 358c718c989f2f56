//! `cargo xtask bundle`: prebuilt test binaries for a machine without cargo.

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<()> {
    bail!("bundle is not implemented yet")
}
