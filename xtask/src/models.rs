//! `cargo xtask fetch-model` and `cargo xtask synth-model`.

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct FetchArgs {}

#[derive(clap::Args)]
pub struct SynthArgs {}

pub fn fetch(_args: FetchArgs) -> Result<()> {
    bail!("fetch-model is not implemented yet")
}

pub fn synth(_args: SynthArgs) -> Result<()> {
    bail!("synth-model is not implemented yet")
}
