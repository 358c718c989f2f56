//! `cargo xtask verify-rocm`: platform report plus the whole test suite.

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<()> {
    bail!("verify-rocm is not implemented yet")
}
