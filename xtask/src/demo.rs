//! `cargo xtask demo`: the main job.
//!
//! Fetches Gemma 3 270M, then generates from a prompt on the best device, streaming tokens,
//! and ends with tok/s and a short memory summary; then fetches SmolLM2-135M-Instruct and asks
//! it one question through `hipdecode chat` and its chat template. The generation runs the release build of
//! the `hipdecode` binary as a subprocess: `cargo xtask` itself is built in the dev profile,
//! where the decoder would run several times slower than it can.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

const DEFAULT_PROMPT: &str = "Photosynthesis is the process by which";

/// The chat part's question to the instruct model.
const CHAT_QUESTION: &str = "What is the capital of France? Answer in one sentence.";

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
    /// Skip the downloads (the models must already be in the models folder).
    #[arg(long)]
    pub offline: bool,
}

/// `xtask fetch-model NAME`, unless offline; then the model's path, which must exist.
fn fetched(offline: bool, name: &str, file: &str) -> Result<std::path::PathBuf> {
    if !offline {
        let xtask = std::env::current_exe().context("locating the xtask binary")?;
        let status = Command::new(xtask)
            .current_dir(crate::workspace_root())
            .args(["fetch-model", name])
            .status()
            .context("could not start `xtask fetch-model`")?;
        if !status.success() {
            bail!("fetching {name} failed ({status}); see the messages above");
        }
    }
    let path = crate::models::models_dir().join(file);
    if !path.exists() {
        bail!(
            "{} is missing; run `cargo xtask fetch-model {name}` (or drop --offline)",
            path.display()
        );
    }
    Ok(path)
}

pub fn run(args: Args) -> Result<()> {
    let root = crate::workspace_root();
    let model = fetched(args.offline, "gemma3-270m", "gemma3-270m-q4_k_m.gguf")?;
    let instruct = fetched(
        args.offline,
        "smollm2-135m",
        "smollm2-135m-instruct-q4_1.gguf",
    )?;
    eprintln!("==> building the release hipdecode binary");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .current_dir(&root)
        .args([
            "build",
            "--release",
            "-p",
            "hipdecode",
            "--bin",
            "hipdecode",
        ])
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
    chat(&bin, &instruct, &args)
}

/// One question to the instruct model through `hipdecode chat`, piped.
fn chat(bin: &Path, model: &Path, args: &Args) -> Result<()> {
    eprintln!("\n==> hipdecode chat -m {}", model.display());
    eprintln!("> {CHAT_QUESTION}");
    let mut child = Command::new(bin)
        .arg("chat")
        .arg("-m")
        .arg(model)
        .args(["-n", "64", "--temp", &args.temp.to_string()])
        .args(["--device", &args.device])
        .stdin(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start {}", bin.display()))?;
    let mut stdin = child.stdin.take().context("the chat's stdin")?;
    writeln!(stdin, "{CHAT_QUESTION}").context("asking the question")?;
    // The end of input ends the chat after the answer.
    drop(stdin);
    let status = child.wait().context("waiting for hipdecode chat")?;
    if !status.success() {
        bail!("hipdecode chat failed ({status})");
    }
    Ok(())
}
