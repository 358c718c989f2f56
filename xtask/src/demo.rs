//! `cargo xtask demo`: the main job.
//!
//! Fetches Gemma 3 270M, then generates from a prompt on the best device, streaming tokens,
//! and ends with tok/s and a short memory summary. The generation runs the release build of
//! the `hipdecode` binary as a subprocess: `cargo xtask` itself is built in the dev profile,
//! where the decoder would run several times slower than it can.

use anyhow::{bail, Context, Result};
use std::process::Command;

const DEFAULT_PROMPT: &str = "Photosynthesis is the process by which";

#[derive(clap::Args)]
pub struct Args {
    /// The prompt to continue.
    #[arg(short, long, default_value = DEFAULT_PROMPT)]
    pub prompt: String,
    /// Tokens to generate.
    #[arg(short = 'n', long, default_value_t = 64)]
    pub n_predict: usize,
    /// auto, cpu or gpu.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Sampling temperature; 0 (the default) is greedy, so the demo is reproducible.
    #[arg(long, default_value_t = 0.0)]
    pub temp: f32,
    /// Skip the download (the model must already be in the models folder).
    #[arg(long)]
    pub offline: bool,
}

pub fn run(args: Args) -> Result<()> {
    let root = crate::workspace_root();
    if !args.offline {
        let xtask = std::env::current_exe().context("locating the xtask binary")?;
        let status = Command::new(xtask)
            .current_dir(&root)
            .args(["fetch-model", "gemma3-270m"])
            .status()
            .context("could not start `xtask fetch-model`")?;
        if !status.success() {
            bail!("fetching Gemma 3 270M failed ({status}); see the messages above");
        }
    }
    let model = crate::models::models_dir().join("gemma3-270m-q4_k_m.gguf");
    if !model.exists() {
        bail!(
            "{} is missing; run `cargo xtask fetch-model gemma3-270m` (or drop --offline)",
            model.display()
        );
    }
    eprintln!("==> building the release hipdecode binary");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .current_dir(&root)
        .args(["build", "--release", "-p", "decode", "--bin", "hipdecode"])
        .status()
        .context("could not start cargo")?;
    if !status.success() {
        bail!("building hipdecode failed ({status})");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let bin = target.join("release").join("hipdecode");
    eprintln!(
        "==> hipdecode run -m {} -n {}",
        model.display(),
        args.n_predict
    );
    let status = Command::new(&bin)
        .current_dir(&root)
        .arg("run")
        .arg("-m")
        .arg(&model)
        .args(["-p", &args.prompt])
        .args(["-n", &args.n_predict.to_string()])
        .args(["--temp", &args.temp.to_string()])
        .args(["--device", &args.device])
        .status()
        .with_context(|| format!("could not start {}", bin.display()))?;
    if !status.success() {
        bail!("hipdecode failed ({status})");
    }
    Ok(())
}
