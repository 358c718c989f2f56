//! `cargo xtask bundle`: prebuilt test binaries for a machine without cargo.
//!
//! Builds every test binary of the workspace in release mode plus the release `xtask`, copies
//! them stripped into one folder with `manifest.json` (binary → crate directory) and `run.sh`.
//! On the target machine, from the checkout root:
//!
//! ```sh
//! mkdir -p /work && ln -sfn "$PWD" /work/main; bundle/xtask verify-rocm --bundle bundle
//! ```
//!
//! (the symlink makes the compile-time `CARGO_MANIFEST_DIR` paths baked into the tests resolve).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The manifest file inside a bundle.
pub const MANIFEST: &str = "manifest.json";

#[derive(clap::Args)]
pub struct Args {
    /// Output folder (created; existing binaries in it are replaced).
    #[arg(long, default_value = "bundle")]
    pub out: PathBuf,
    /// Do not strip the copied binaries.
    #[arg(long)]
    pub no_strip: bool,
}

/// One prebuilt test binary.
pub struct BundledTest {
    /// Path of the binary relative to the bundle folder.
    pub binary: String,
    /// Crate directory relative to the workspace root (the binary runs there).
    pub crate_dir: String,
    /// Readable name: `<package>/<target>`.
    pub name: String,
}

pub fn run(args: Args) -> Result<()> {
    let root = crate::workspace_root();
    let out = if args.out.is_absolute() {
        args.out.clone()
    } else {
        root.join(&args.out)
    };
    std::fs::create_dir_all(out.join("tests"))
        .with_context(|| format!("creating {}", out.display()))?;

    eprintln!("==> building the workspace's test binaries (release)");
    let (artifacts, failed_packages) = build_tests_per_package_on_failure(&root, &["--release"])?;
    let build_ok = failed_packages.is_empty();
    if !build_ok {
        eprintln!(
            "warning: test targets of {} failed to build (see above); the bundle lacks them",
            failed_packages.join(", ")
        );
    }
    let mut tests = Vec::new();
    for artifact in &artifacts {
        if !artifact.is_test {
            continue;
        }
        let file_name = artifact
            .executable
            .file_name()
            .context("test executable without a file name")?
            .to_string_lossy()
            .into_owned();
        let dest = out.join("tests").join(&file_name);
        copy_binary(&artifact.executable, &dest, !args.no_strip)?;
        let crate_dir = artifact
            .manifest_dir
            .strip_prefix(&root)
            .unwrap_or(&artifact.manifest_dir)
            .to_string_lossy()
            .into_owned();
        tests.push(BundledTest {
            binary: format!("tests/{file_name}"),
            crate_dir,
            name: format!("{}/{}", artifact.package, artifact.target),
        });
    }
    tests.sort_by(|a, b| a.name.cmp(&b.name));

    // Integration tests run the workspace's programs through the absolute path cargo compiled
    // into them (`CARGO_BIN_EXE_*`), so the bundle carries those programs with that path and
    // verify-rocm puts them back there before the tests run.
    std::fs::create_dir_all(out.join("bin"))?;
    let mut programs = Vec::new();
    for artifact in artifacts
        .iter()
        .filter(|a| !a.is_test && a.target != "xtask")
    {
        let Some(file_name) = artifact.executable.file_name() else {
            continue;
        };
        let file_name = file_name.to_string_lossy().into_owned();
        copy_binary(
            &artifact.executable,
            &out.join("bin").join(&file_name),
            !args.no_strip,
        )?;
        programs.push(serde_json::json!({
            "binary": format!("bin/{file_name}"),
            "build_path": artifact.executable,
        }));
    }

    eprintln!("==> building the release xtask");
    let xtask = cargo_artifacts(
        &root,
        &["build", "--release", "-p", "xtask", "--message-format=json"],
    )?
    .into_iter()
    .find(|a| a.target == "xtask" && !a.is_test)
    .context("cargo did not report the xtask executable")?;
    copy_binary(&xtask.executable, &out.join("xtask"), !args.no_strip)?;

    let manifest = serde_json::json!({
        "complete": build_ok,
        "failed_packages": failed_packages,
        "programs": programs,
        "tests": tests.iter().map(|t| serde_json::json!({
            "binary": t.binary,
            "crate_dir": t.crate_dir,
            "name": t.name,
        })).collect::<Vec<_>>(),
    });
    std::fs::write(
        out.join(MANIFEST),
        serde_json::to_string_pretty(&manifest)? + "\n",
    )?;
    write_run_script(&out)?;

    let total: u64 = walk_size(&out);
    println!(
        "bundle: {} test binaries, {} programs + xtask in {} ({:.1} MiB)",
        tests.len(),
        programs.len(),
        out.display(),
        total as f64 / (1 << 20) as f64
    );
    println!(
        "run there (from the checkout root): mkdir -p /work && ln -sfn \"$PWD\" /work/main; \
         {0}/xtask verify-rocm --bundle {0}",
        args.out.display()
    );
    Ok(())
}

/// A test or binary artifact reported by cargo.
pub(crate) struct Artifact {
    pub package: String,
    pub target: String,
    pub executable: PathBuf,
    pub manifest_dir: PathBuf,
    pub is_test: bool,
}

/// Runs cargo with a JSON message format and collects the executables it reports; fails if
/// cargo fails.
pub(crate) fn cargo_artifacts(root: &Path, cargo_args: &[&str]) -> Result<Vec<Artifact>> {
    let (artifacts, ok) = cargo_artifacts_status(root, cargo_args)?;
    if !ok {
        bail!("cargo {} failed", cargo_args.join(" "));
    }
    Ok(artifacts)
}

/// Builds every test target of the workspace (`cargo test --workspace --no-run` plus
/// `extra_args`). If that fails, builds package by package so one crate that does not compile
/// costs only its own tests; returns the artifacts and the packages that failed.
pub(crate) fn build_tests_per_package_on_failure(
    root: &Path,
    extra_args: &[&str],
) -> Result<(Vec<Artifact>, Vec<String>)> {
    let mut args = vec![
        "test",
        "--workspace",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ];
    args.extend_from_slice(extra_args);
    let (artifacts, ok) = cargo_artifacts_status(root, &args)?;
    if ok {
        return Ok((artifacts, Vec::new()));
    }
    eprintln!("==> the workspace build failed; building package by package");
    let mut all = Vec::new();
    let mut failed = Vec::new();
    for package in workspace_packages(root)? {
        let mut args = vec![
            "test",
            "-p",
            package.as_str(),
            "--no-run",
            "--message-format=json-render-diagnostics",
        ];
        args.extend_from_slice(extra_args);
        let (artifacts, ok) = cargo_artifacts_status(root, &args)?;
        all.extend(artifacts);
        if !ok {
            failed.push(package);
        }
    }
    // A package's test build also reports its dependencies' (non-test) artifacts; keep each
    // executable once.
    all.sort_by(|a, b| a.executable.cmp(&b.executable));
    all.dedup_by(|a, b| a.executable == b.executable);
    Ok((all, failed))
}

/// Names of the workspace's member packages, from `cargo metadata`.
fn workspace_packages(root: &Path) -> Result<Vec<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(root)
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!("cargo metadata failed ({})", output.status);
    }
    let value: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    Ok(value["packages"]
        .as_array()
        .map(|packages| {
            packages
                .iter()
                .filter_map(|p| p["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

/// Like [`cargo_artifacts`], but returns what was built together with cargo's success.
pub(crate) fn cargo_artifacts_status(
    root: &Path,
    cargo_args: &[&str],
) -> Result<(Vec<Artifact>, bool)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(root)
        .args(cargo_args)
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo")?;
    let mut artifacts = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(executable) = message["executable"].as_str() else {
            continue;
        };
        let manifest = PathBuf::from(message["manifest_path"].as_str().unwrap_or_default());
        let package_id = message["package_id"].as_str().unwrap_or_default();
        artifacts.push(Artifact {
            package: package_name(package_id, &manifest),
            target: message["target"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            executable: PathBuf::from(executable),
            manifest_dir: manifest.parent().map(PathBuf::from).unwrap_or_default(),
            is_test: message["profile"]["test"].as_bool().unwrap_or(false),
        });
    }
    Ok((artifacts, output.status.success()))
}

/// The package name: the crate directory's name is the package name in this workspace.
fn package_name(package_id: &str, manifest: &Path) -> String {
    manifest
        .parent()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| package_id.to_string())
}

fn copy_binary(from: &Path, to: &Path, strip: bool) -> Result<()> {
    // Replace rather than overwrite: a running or read-only old copy must not block us.
    let _ = std::fs::remove_file(to);
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    if strip {
        let status = Command::new("strip").arg(to).status();
        match status {
            Ok(s) if s.success() => {}
            _ => eprintln!(
                "warning: could not strip {} (is binutils installed?)",
                to.display()
            ),
        }
    }
    Ok(())
}

fn write_run_script(out: &Path) -> Result<()> {
    let script = r#"#!/bin/sh
# Runs the prebuilt verify-rocm from a hipdecode bundle, on a machine without cargo.
# Call it from the checkout root: bundle/run.sh [extra verify-rocm arguments]
# The tests look for their files under the compile-time path /work/main, so that path is
# pointed at this checkout when it is free (or already a symlink).
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
if [ ! -e /work/main ] || [ -L /work/main ]; then
    mkdir -p /work && ln -sfn "$root" /work/main
fi
exec "$here/xtask" verify-rocm --bundle "$here" "$@"
"#;
    let path = out.join("run.sh");
    std::fs::write(&path, script)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

fn walk_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => walk_size(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}

/// Reads a bundle's manifest: its tests, and whether every test target had built.
pub fn read_manifest(bundle: &Path) -> Result<(Vec<BundledTest>, bool)> {
    let path = bundle.join(MANIFEST);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (build the bundle with `cargo xtask bundle`)",
            path.display()
        )
    })?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let Some(entries) = value["tests"].as_array() else {
        bail!("{} has no \"tests\" list", path.display());
    };
    let complete = value["complete"].as_bool().unwrap_or(true);
    let tests = entries
        .iter()
        .map(|e| {
            let field = |k: &str| {
                e[k].as_str()
                    .map(str::to_string)
                    .with_context(|| format!("manifest entry without \"{k}\": {e}"))
            };
            Ok(BundledTest {
                binary: field("binary")?,
                crate_dir: field("crate_dir")?,
                name: field("name")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((tests, complete))
}

/// Copies the bundle's programs back to the paths they were built at, where the tests that
/// run them look for them; a path that already holds a file is left alone.
pub fn restore_programs(bundle: &Path) -> Result<()> {
    let path = bundle.join(MANIFEST);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    for program in value["programs"].as_array().into_iter().flatten() {
        let (Some(binary), Some(build_path)) =
            (program["binary"].as_str(), program["build_path"].as_str())
        else {
            bail!(
                "{}: a program entry lacks \"binary\" or \"build_path\": {program}",
                path.display()
            );
        };
        let target = PathBuf::from(build_path);
        if target.exists() {
            continue;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).with_context(|| {
                format!("creating {} for the bundled {binary}", parent.display())
            })?;
        }
        std::fs::copy(bundle.join(binary), &target)
            .with_context(|| format!("restoring the bundled {binary} to {}", target.display()))?;
    }
    Ok(())
}
