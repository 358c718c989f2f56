//! `cargo xtask test`: the README's test command for a fresh machine.
//!
//! It installs the Python reference tools the tests compare against, fetches the real test
//! models (Gemma 3 270M and SmolLM2-135M-Instruct), writes the small synthetic `tiny-*`
//! models (as `cargo xtask synth-model` would), self-tests the references on all of them, then
//! runs the whole workspace's tests. Before all
//! that it checks the crates' import cycles against their allowlist (`cargo xtask cycles`),
//! which takes a moment and needs nothing installed. Real-model
//! tests, Python and Rust, are required to run here (`HIPDECODE_REQUIRE_MODELS=1`), so a missing
//! model fails instead of being skipped.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;

/// Makes a missing model a test failure instead of a skip (Rust and Python tests read it).
const REQUIRE_MODELS_VAR: &str = gguf_loader::knobs::REQUIRE_MODELS.name;

#[derive(clap::Args)]
pub struct Args {
    /// Skip the model download and the Python install; real-model tests then skip themselves.
    #[arg(long)]
    pub offline: bool,
    /// Extra arguments passed to `cargo test` (after `--workspace`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub cargo_args: Vec<String>,
}

pub fn run(args: Args) -> Result<()> {
    let root = crate::workspace_root();
    eprintln!("==> check the crates' import cycles against the allowlist");
    crate::cycles::check(&root)?;

    let mut cargo_test = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cargo_test.current_dir(&root).arg("test").arg("--workspace");
    cargo_test.args(&args.cargo_args);

    if !args.offline {
        install_python_reference(&root)?;
        let xtask = std::env::current_exe().context("locating the xtask binary")?;
        for (what, name) in [
            ("fetch the Gemma 3 270M test model", "gemma3-270m"),
            ("fetch the SmolLM2-135M-Instruct test model", "smollm2-135m"),
        ] {
            run_step(
                what,
                Command::new(&xtask)
                    .current_dir(&root)
                    .args(["fetch-model", name]),
            )?;
        }
        eprintln!("==> write the synthetic tiny-* models for the reference self-test");
        crate::models::synth_tiny_presets(&crate::models::models_dir())?;
        run_step(
            "self-test the numpy reference",
            Command::new("python3")
                .current_dir(&root)
                .env(REQUIRE_MODELS_VAR, "1")
                .arg("tests/reference/test_reference.py"),
        )?;
        cargo_test.env(REQUIRE_MODELS_VAR, "1");
    }
    run_step("cargo test --workspace", &mut cargo_test)
}

fn install_python_reference(root: &Path) -> Result<()> {
    let requirements = root.join("tests/reference/requirements.txt");
    if !requirements.exists() {
        return Ok(());
    }
    run_step(
        "install the Python reference packages",
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(&requirements),
    )
}

fn run_step(what: &str, command: &mut Command) -> Result<()> {
    eprintln!("==> {what}");
    let status = command
        .status()
        .with_context(|| format!("could not start the step '{what}'"))?;
    if !status.success() {
        bail!("step '{what}' failed ({status})");
    }
    Ok(())
}
