//! `cargo xtask bindgen`: regenerate the committed HIP bindings.

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<()> {
    bail!("bindgen is not implemented yet")
}
