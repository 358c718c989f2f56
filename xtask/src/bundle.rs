//! `cargo xtask bundle`: prebuilt test binaries for a machine without cargo.
//!
//! Builds every test binary of the workspace in release mode plus the release `xtask`, copies
//! them stripped into one folder with `manifest.json` (the build's workspace root, binary →
//! crate directory) and `run.sh`. On the target machine, with the bundle folder inside a checkout
//! of the same commit, run `bundle/run.sh` (or `bundle/xtask verify-rocm --bundle bundle`).
//!
//! The tests carry the compile-time `CARGO_MANIFEST_DIR` paths of the build machine, so before
//! they run verify-rocm points the recorded build root at the checkout with a symlink when that
//! path is free (see [`link_build_root`]); a bundle built in any folder therefore runs from a
//! checkout in any folder.

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
    /// Leave out the test binaries that never touch a GPU ([`CPU_ONLY_TESTS`]; CI runs them)
    /// and the timing programs no test runs ([`UNUSED_ON_THE_DEVICE`]): the bundle for the
    /// device machine, whose tool carries at most 64 MiB.
    #[arg(long)]
    pub gpu_only: bool,
}

/// Test binaries (`<package>/<target>`) with no GPU test in them: CI runs them on every
/// machine, so a bundle for the GPU machine (`--gpu-only`) need not carry them.
pub const CPU_ONLY_TESTS: &[&str] = &[
    "hipdecode-engine/chat_templates",
    "hipdecode-engine/engine",
    "hipdecode-engine/real_model_reference",
    "hipdecode-engine/generation",
    "hipdecode-engine/hostile_models",
    "hipdecode-engine/kv_pool",
    "hipdecode-engine/model_spec",
    "hipdecode-engine/scheduler",
    "hipdecode-engine/synthetic_reference",
    "hipdecode-engine/tokenizer_defaults",
    "hipdecode-engine/vocab_cases",
    "gguf-loader/dequant_vs_gguf_py",
    "gguf-loader/hostile",
    "gguf-loader/mapping_guard",
    "gguf-loader/model_config",
    "gguf-loader/mutations",
    "gguf-loader/real_gemma",
    "gguf-loader/safetensors",
    "gguf-loader/synth_presets",
    "hipdecode/offload_plan",
    "hipdecode/serve",
    "hipdecode-offload/offload",
    "hipdecode-offload/planner",
    "rocm-alloc/events",
    "rocm-alloc/properties",
    "rocm-alloc/replay",
    "rocm-alloc/replay_format",
    "rocm-alloc/semantics",
    "rocm-alloc/sim_core",
    "hipdecode-serve/serve",
    "xtask/replay_output",
];

/// Programs (`<package>/<target>`) that measure the host or another runtime and that no test
/// runs: a `--gpu-only` bundle leaves them out.
pub const UNUSED_ON_THE_DEVICE: &[&str] = &[
    "gguf-loader/open_timing",
    "rocm-alloc/h200_compare",
    "rocm-alloc/hit_cpu_time",
];

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
    // The previous bundle's binaries go first: their names carry build hashes, so a stale one
    // would never be overwritten and would ride along to the device, past the size a call
    // carries.
    for dir in ["tests", "bin"] {
        let path = out.join(dir);
        if path.exists() {
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("clearing {}", path.display()))?;
        }
    }
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
    let left_out = |a: &Artifact, list: &[&str]| {
        args.gpu_only && list.contains(&format!("{}/{}", a.package, a.target).as_str())
    };
    for artifact in &artifacts {
        if !artifact.is_test || left_out(artifact, CPU_ONLY_TESTS) {
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
        .filter(|a| !a.is_test && a.target != "xtask" && !left_out(a, UNUSED_ON_THE_DEVICE))
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
        "build_root": root,
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
        "run there, from a checkout of this commit that holds the bundle: {}/run.sh",
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

/// The package name from cargo's package id (`path+file:///…/crates/cli#hipdecode@0.1.0`). The
/// id leaves the name out where it is the folder's (`…/crates/knobs#0.1.0`), so the folder's
/// name stands in then.
fn package_name(package_id: &str, manifest: &Path) -> String {
    let folder = || {
        manifest
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| package_id.to_string())
    };
    match package_id.rsplit_once('#') {
        Some((_, fragment)) => match fragment.split_once('@') {
            Some((name, _)) => name.to_string(),
            None => folder(),
        },
        None => folder(),
    }
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
# Usage: bundle/run.sh [extra verify-rocm arguments]; the bundle folder must sit in the checkout
# root. verify-rocm links the build root recorded in manifest.json to that checkout when needed.
# This is the run on the GPU machine, so a GPU test that skips is a failure; set
# HIPDECODE_REQUIRE_GPU=0 to allow skips (on a machine without a GPU).
here=$(cd "$(dirname "$0")" && pwd)
HIPDECODE_REQUIRE_GPU="${HIPDECODE_REQUIRE_GPU:-1}"
export HIPDECODE_REQUIRE_GPU
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

/// What a bundle's manifest says.
pub struct Manifest {
    /// The workspace root the bundle was built in; `None` in bundles older than this field.
    pub build_root: Option<PathBuf>,
    /// The bundled test binaries.
    pub tests: Vec<BundledTest>,
    /// Whether every test target had built.
    pub complete: bool,
}

/// Reads a bundle's manifest.
pub fn read_manifest(bundle: &Path) -> Result<Manifest> {
    let path = bundle.join(MANIFEST);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (build the bundle with `cargo xtask bundle`)",
            path.display()
        )
    })?;
    parse_manifest(&text).with_context(|| format!("parsing {}", path.display()))
}

fn parse_manifest(text: &str) -> Result<Manifest> {
    let value: serde_json::Value = serde_json::from_str(text)?;
    let Some(entries) = value["tests"].as_array() else {
        bail!("no \"tests\" list");
    };
    let build_root = match &value["build_root"] {
        serde_json::Value::Null => None,
        serde_json::Value::String(root) if Path::new(root).is_absolute() => {
            Some(PathBuf::from(root))
        }
        other => bail!("\"build_root\" must be an absolute path, found {other}"),
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
    Ok(Manifest {
        build_root,
        tests,
        complete,
    })
}

/// What to do so that the build root's paths reach the checkout the bundle runs from.
#[derive(Debug, PartialEq, Eq)]
pub enum BuildRootLink {
    /// The checkout is the build root (or a link to it already points there): nothing to do.
    AlreadyThere,
    /// The build root does not exist: create a symlink there to the checkout.
    Create,
    /// The build root is a symlink to somewhere else: point it at the checkout.
    Replace,
    /// The build root is a real folder other than the checkout; it is left alone.
    Conflict,
}

/// Decides how to make `build_root` lead to `checkout` (both as given; symlinks are resolved
/// here to compare them).
pub fn plan_build_root_link(build_root: &Path, checkout: &Path) -> BuildRootLink {
    let same = match (
        std::fs::canonicalize(build_root),
        std::fs::canonicalize(checkout),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same {
        return BuildRootLink::AlreadyThere;
    }
    match std::fs::symlink_metadata(build_root) {
        Err(_) => BuildRootLink::Create,
        Ok(meta) if meta.file_type().is_symlink() => BuildRootLink::Replace,
        Ok(_) => BuildRootLink::Conflict,
    }
}

/// Makes the compile-time paths of a bundle built in `build_root` resolve in `checkout`: a
/// symlink at `build_root` to `checkout`, created (with its parent folders) or repointed as
/// [`plan_build_root_link`] decides. A real folder at `build_root` is an error that says how to
/// proceed, as the tests would otherwise read another checkout's files.
pub fn link_build_root(build_root: &Path, checkout: &Path) -> Result<()> {
    let manual = format!(
        "run from a checkout at {0}, or link it yourself: ln -sfn {1} {0}",
        build_root.display(),
        checkout.display()
    );
    match plan_build_root_link(build_root, checkout) {
        BuildRootLink::AlreadyThere => return Ok(()),
        BuildRootLink::Conflict => bail!(
            "the bundle was built in {}, which exists here and is not this checkout ({}); the \
             tests would read that folder's files. Move it aside and {manual}",
            build_root.display(),
            checkout.display()
        ),
        BuildRootLink::Replace => std::fs::remove_file(build_root).with_context(|| {
            format!(
                "removing the old symlink {} to repoint it; {manual}",
                build_root.display()
            )
        })?,
        BuildRootLink::Create => {
            if let Some(parent) = build_root.parent() {
                std::fs::create_dir_all(parent).with_context(|| {
                    format!(
                        "creating {} for the build-root link; {manual}",
                        parent.display()
                    )
                })?;
            }
        }
    }
    symlink_dir(checkout, build_root).with_context(|| {
        format!(
            "linking {} to this checkout; {manual}",
            build_root.display()
        )
    })?;
    eprintln!(
        "linked the bundle's build root {} to this checkout {}",
        build_root.display(),
        checkout.display()
    );
    Ok(())
}

#[cfg(unix)]
fn symlink_dir(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
fn symlink_dir(_target: &Path, _link: &Path) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "bundles run on Linux only",
    ))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_come_from_the_id_or_else_the_folder() {
        let manifest = Path::new("/w/crates/cli/Cargo.toml");
        let id = "path+file:///w/crates/cli#hipdecode@0.1.0";
        assert_eq!(package_name(id, manifest), "hipdecode");
        let manifest = Path::new("/w/crates/knobs/Cargo.toml");
        assert_eq!(
            package_name("path+file:///w/crates/knobs#0.1.0", manifest),
            "knobs"
        );
    }

    /// The `--gpu-only` lists name targets that exist, and no listed test binary holds a GPU
    /// test: a GPU test added to one would otherwise silently leave the device's run.
    #[test]
    fn the_gpu_only_lists_name_real_targets_without_gpu_tests() {
        let root = crate::workspace_root();
        let out = match Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args([
                "metadata",
                "--no-deps",
                "--format-version",
                "1",
                "--offline",
            ])
            .current_dir(&root)
            .output()
        {
            Ok(out) => out,
            // A bundle's run on the GPU machine has no toolchain; the list is checked where
            // bundles are built.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!(
                    "skipping: cargo is not installed here, and the check reads `cargo metadata`"
                );
                return;
            }
            Err(e) => panic!("cargo metadata: {e}"),
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut targets = std::collections::HashMap::new();
        for p in meta["packages"].as_array().unwrap() {
            for t in p["targets"].as_array().unwrap() {
                let name = format!(
                    "{}/{}",
                    p["name"].as_str().unwrap(),
                    t["name"].as_str().unwrap()
                );
                targets.insert(name, PathBuf::from(t["src_path"].as_str().unwrap()));
            }
        }
        // What a test that reaches a GPU uses: the skip helpers, the requirement switch, the
        // probe, the GPU backend and allocator device, or `--device gpu` passed as arguments.
        let gpu_markers = [
            "gpu_or_skip",
            "device_or_skip",
            "REQUIRE_GPU",
            "probe_gpu",
            "GpuBackend",
            "HipDevice",
            "\"gpu\"",
        ];
        for name in UNUSED_ON_THE_DEVICE {
            assert!(
                targets.contains_key(*name),
                "{name} is listed but is no target"
            );
        }
        for name in CPU_ONLY_TESTS {
            let src = targets
                .get(*name)
                .unwrap_or_else(|| panic!("{name} is listed but is no target of the workspace"));
            // A library's unit tests live in every file of its src folder.
            let files: Vec<PathBuf> = if src.ends_with("lib.rs") {
                walk_rs(src.parent().unwrap())
            } else {
                vec![src.clone()]
            };
            for f in files {
                let text = std::fs::read_to_string(&f).unwrap();
                for m in gpu_markers {
                    assert!(
                        !text.contains(m),
                        "{name} is listed as never touching a GPU, but {} mentions {m}",
                        f.display()
                    );
                }
            }
        }
    }

    fn walk_rs(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.extend(walk_rs(&p));
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
        out
    }

    /// A fresh, empty folder under the system temp dir, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(label: &str) -> TempDir {
            let dir = std::env::temp_dir().join(format!(
                "xtask-bundle-{label}-{}-{:?}",
                std::process::id(),
                std::time::SystemTime::now()
            ));
            std::fs::create_dir_all(&dir).expect("creating a temp dir");
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_bundle_built_elsewhere_runs_from_this_checkout() {
        let tmp = TempDir::new("elsewhere");
        // The checkout the bundle runs from, with one crate file a test reads by its
        // compile-time path.
        let checkout = tmp.0.join("checkout");
        std::fs::create_dir_all(checkout.join("crates/decode")).unwrap();
        std::fs::write(checkout.join("crates/decode/marker"), "here").unwrap();
        // The build machine's root: a path that does not exist here and is not /work/main.
        let build_root = tmp.0.join("builder/home/ci/hipdecode");
        let manifest = serde_json::json!({
            "build_root": build_root,
            "complete": true,
            "programs": [],
            "tests": [{"binary": "tests/decode-1", "crate_dir": "crates/decode",
                       "name": "decode/decode"}],
        });
        let parsed = parse_manifest(&manifest.to_string()).unwrap();
        assert_eq!(parsed.build_root.as_deref(), Some(build_root.as_path()));
        assert_eq!(parsed.tests[0].crate_dir, "crates/decode");

        assert_eq!(
            plan_build_root_link(&build_root, &checkout),
            BuildRootLink::Create
        );
        link_build_root(&build_root, &checkout).unwrap();
        let baked = build_root.join("crates/decode/marker");
        assert_eq!(std::fs::read_to_string(baked).unwrap(), "here");
        assert_eq!(
            plan_build_root_link(&build_root, &checkout),
            BuildRootLink::AlreadyThere
        );
        // A second run is a no-op.
        link_build_root(&build_root, &checkout).unwrap();
    }

    #[test]
    fn a_stale_link_is_repointed_and_a_real_folder_is_refused() {
        let tmp = TempDir::new("stale");
        let checkout = tmp.0.join("checkout");
        let old = tmp.0.join("old-checkout");
        std::fs::create_dir_all(&checkout).unwrap();
        std::fs::create_dir_all(&old).unwrap();
        let build_root = tmp.0.join("root");
        symlink_dir(&old, &build_root).unwrap();
        assert_eq!(
            plan_build_root_link(&build_root, &checkout),
            BuildRootLink::Replace
        );
        link_build_root(&build_root, &checkout).unwrap();
        assert_eq!(
            std::fs::canonicalize(&build_root).unwrap(),
            std::fs::canonicalize(&checkout).unwrap()
        );

        let occupied = tmp.0.join("occupied");
        std::fs::create_dir_all(&occupied).unwrap();
        assert_eq!(
            plan_build_root_link(&occupied, &checkout),
            BuildRootLink::Conflict
        );
        let err = format!("{:#}", link_build_root(&occupied, &checkout).unwrap_err());
        assert!(
            err.contains("is not this checkout") && err.contains("ln -sfn"),
            "{err}"
        );
    }

    #[test]
    fn the_checkout_itself_needs_no_link() {
        let tmp = TempDir::new("same");
        assert_eq!(
            plan_build_root_link(&tmp.0, &tmp.0),
            BuildRootLink::AlreadyThere
        );
    }

    #[test]
    fn manifest_build_root_must_be_absolute_and_may_be_absent() {
        let old = parse_manifest(r#"{"tests": []}"#).unwrap();
        assert!(old.build_root.is_none() && old.complete);
        let err = parse_manifest(r#"{"build_root": "relative/dir", "tests": []}"#)
            .err()
            .expect("a relative build root is refused");
        assert!(err.to_string().contains("absolute path"), "{err}");
    }

    #[test]
    fn the_run_script_links_nothing_itself_and_requires_a_gpu() {
        let tmp = TempDir::new("script");
        write_run_script(&tmp.0).unwrap();
        let script = std::fs::read_to_string(tmp.0.join("run.sh")).unwrap();
        assert!(!script.contains("/work/main"), "{script}");
        assert!(script.contains("HIPDECODE_REQUIRE_GPU:-1"), "{script}");
        assert!(script.contains("verify-rocm --bundle"), "{script}");
    }
}
