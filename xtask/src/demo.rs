//! `cargo xtask demo`: the main job.

use anyhow::Result;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<()> {
    println!("hipdecode demo: model decoding has not landed yet; nothing to run.");
    Ok(())
}
