//! `cargo xtask verify-rocm`: platform report plus the whole test suite.
//!
//! Prints the detected platform, every visible device with its attributes and memory figures,
//! then runs every test binary of the workspace (built by cargo here, or prebuilt with
//! `cargo xtask bundle` and passed as `--bundle DIR` on a machine without cargo), each from its
//! crate directory, and prints a per-binary pass/fail/skip table. Exits non-zero on any failure.
//! Without a GPU it says so and runs the same suite: the GPU tests skip themselves with a
//! printed reason, which is counted in the "skipped" column.

use anyhow::{bail, Result};
use hip_ffi::{Device, Platform, PlatformKind};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Run the prebuilt test binaries of this bundle (from `cargo xtask bundle`) instead of
    /// building with cargo.
    #[arg(long)]
    pub bundle: Option<PathBuf>,
    /// Print the platform report only.
    #[arg(long)]
    pub no_tests: bool,
    /// Arguments passed to every test binary (a name filter, `--test-threads=1`, ...).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub test_args: Vec<String>,
}

pub fn run(args: Args) -> Result<()> {
    let has_gpu = print_platform_report();
    if args.no_tests {
        return Ok(());
    }
    if !has_gpu {
        println!(
            "\nNo GPU found: running the CPU part of the test suite; GPU tests skip themselves \
             with a printed reason (counted as skipped)."
        );
    }
    let root = match &args.bundle {
        // The bundle sits in the checkout root; its crate paths are relative to that root.
        Some(bundle) => std::fs::canonicalize(bundle)?
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(crate::workspace_root),
        None => crate::workspace_root(),
    };
    let mut build_failed = false;
    let binaries = match &args.bundle {
        Some(bundle) => {
            let bundle = std::fs::canonicalize(bundle)?;
            let (tests, complete) = crate::bundle::read_manifest(&bundle)?;
            crate::bundle::restore_programs(&bundle)?;
            if !complete {
                build_failed = true;
                println!(
                    "\nWARNING: this bundle is incomplete: some test targets failed to build \
                     when it was made, so their tests are missing (counted as a failure)."
                );
            }
            tests
                .into_iter()
                .map(|t| TestBinary {
                    path: bundle.join(&t.binary),
                    crate_dir: root.join(&t.crate_dir),
                    name: t.name,
                })
                .collect()
        }
        None => {
            let (binaries, ok) = cargo_test_binaries(&root)?;
            build_failed = !ok;
            binaries
        }
    };

    println!("\n== test suite: {} test binaries ==", binaries.len());
    let mut runs: Vec<TestRun> = binaries
        .iter()
        .map(|b| run_binary(b, &args.test_args))
        .collect();
    if args.bundle.is_none() {
        runs.push(run_doctests(&root));
    }
    print_summary(&runs);
    let failed: Vec<&str> = runs
        .iter()
        .filter(|r| !r.ok())
        .map(|r| r.name.as_str())
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} test binaries failed: {}",
            failed.len(),
            failed.join(", ")
        );
    }
    if build_failed {
        bail!("some test targets did not build, so the suite is incomplete");
    }
    Ok(())
}

fn gib(bytes: u64) -> String {
    format!(
        "{:.2} GiB ({bytes} bytes)",
        bytes as f64 / (1u64 << 30) as f64
    )
}

fn yes_no(flag: bool) -> &'static str {
    if flag {
        "yes"
    } else {
        "no"
    }
}

/// Prints platform and devices; returns whether a GPU is usable.
fn print_platform_report() -> bool {
    println!("== hipdecode verify-rocm ==");
    println!("host: {} {}", std::env::consts::OS, std::env::consts::ARCH);
    for var in [
        "HIP_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        hip_ffi::platform::PLATFORM_OVERRIDE_VAR,
    ] {
        let value = std::env::var(var).unwrap_or_else(|_| "<unset>".into());
        println!("{var}: {value}");
    }
    let platform = Platform::detect();
    println!("platform: {}", platform.kind());
    if let Some(version) = platform.version() {
        println!("runtime: {version}");
    }
    for note in platform.notes() {
        println!("note: {note}");
    }
    if platform.kind() == PlatformKind::None {
        return false;
    }
    println!("devices: {}", platform.device_count());
    for ordinal in 0..platform.device_count() {
        match platform.device(ordinal) {
            Ok(device) => print_device(ordinal, &device),
            Err(e) => println!("device {ordinal}: {e}"),
        }
    }
    true
}

fn print_device(ordinal: usize, device: &Device) {
    let attrs = match device.attributes() {
        Ok(a) => a,
        Err(e) => {
            println!("device {ordinal}: attributes unavailable: {e}");
            return;
        }
    };
    println!("device {ordinal}: {}", attrs.name);
    let row = |k: &str, v: String| println!("  {k:<28} {v}");
    row(
        "arch",
        attrs
            .arch
            .clone()
            .unwrap_or_else(|| "unknown (hiprtc targets the current device)".into()),
    );
    row(
        "compute capability",
        format!(
            "{}.{}",
            attrs.compute_capability.0, attrs.compute_capability.1
        ),
    );
    row("total memory", gib(attrs.total_memory));
    match device.mem_get_info() {
        Ok(info) => {
            row("mem_get_info free", gib(info.free));
            row("mem_get_info total", gib(info.total));
            row(
                "GTT (sysfs)",
                match info.gtt {
                    Some(g) => format!("{} total, {} used", gib(g.total), gib(g.used)),
                    None => "n/a".into(),
                },
            );
        }
        Err(e) => row("mem_get_info", format!("failed: {e}")),
    }
    row("integrated (UMA)", yes_no(attrs.integrated).into());
    row("warp size", attrs.warp_size.to_string());
    row("multiprocessors", attrs.multiprocessor_count.to_string());
    row("managed memory", yes_no(attrs.managed_memory).into());
    row(
        "pageable memory access",
        yes_no(attrs.pageable_memory_access).into(),
    );
    row(
        "concurrent managed access",
        yes_no(attrs.concurrent_managed_access).into(),
    );
    row(
        "can map host memory",
        yes_no(attrs.can_map_host_memory).into(),
    );
    row("stream-ordered alloc", yes_no(attrs.async_alloc).into());
    row(
        "max threads per block",
        attrs.max_threads_per_block.to_string(),
    );
    row(
        "max shared memory per block",
        format!("{} bytes", attrs.max_shared_memory_per_block),
    );
    row("PCI location", attrs.pci.sysfs_name());
    match hip_ffi::device_compile_options(device) {
        Ok(options) => row("kernel compile options", options.join(" ")),
        Err(e) => row("kernel compile options", format!("failed: {e}")),
    }
}

struct TestBinary {
    path: PathBuf,
    crate_dir: PathBuf,
    name: String,
}

#[derive(Default)]
struct TestRun {
    name: String,
    passed: u32,
    failed: u32,
    ignored: u32,
    skipped: u32,
    saw_summary: bool,
    exit_ok: bool,
    elapsed: Duration,
    skip_reasons: Vec<String>,
}

impl TestRun {
    fn ok(&self) -> bool {
        self.exit_ok && self.saw_summary && self.failed == 0
    }
}

/// Builds the test binaries with cargo (dev profile) and lists them, with whether every
/// target built (one broken crate does not hide the others' results).
fn cargo_test_binaries(root: &Path) -> Result<(Vec<TestBinary>, bool)> {
    eprintln!("==> cargo test --workspace --no-run");
    let (artifacts, failed_packages) =
        crate::bundle::build_tests_per_package_on_failure(root, &[])?;
    let ok = failed_packages.is_empty();
    let mut binaries: Vec<TestBinary> = artifacts
        .into_iter()
        .filter(|a| a.is_test)
        .map(|a| TestBinary {
            name: format!("{}/{}", a.package, a.target),
            path: a.executable,
            crate_dir: a.manifest_dir,
        })
        .collect();
    binaries.sort_by(|a, b| a.name.cmp(&b.name));
    if !ok {
        println!(
            "\nWARNING: some test targets failed to build (see above); their tests are missing."
        );
    }
    Ok((binaries, ok))
}

/// Parses libtest's output: summary counts and printed skip reasons.
fn parse_libtest(output: &str, run: &mut TestRun) {
    for line in output.lines() {
        let trimmed = line.trim();
        if let Some(rest) = trimmed.strip_prefix("test result:") {
            run.saw_summary = true;
            for part in rest.split(';') {
                let mut words = part
                    .split_whitespace()
                    .filter(|w| *w != "ok." && *w != "FAILED.");
                let (Some(n), Some(what)) = (words.next(), words.next()) else {
                    continue;
                };
                let Ok(n) = n.parse::<u32>() else { continue };
                match what {
                    "passed" => run.passed += n,
                    "failed" => run.failed += n,
                    "ignored" => run.ignored += n,
                    _ => {}
                }
            }
        } else if trimmed.to_ascii_lowercase().starts_with("skipping") {
            run.skipped += 1;
            run.skip_reasons.push(trimmed.to_string());
        }
    }
}

fn run_binary(binary: &TestBinary, extra: &[String]) -> TestRun {
    let mut run = TestRun {
        name: binary.name.clone(),
        ..TestRun::default()
    };
    eprintln!("--> {}", binary.name);
    let started = Instant::now();
    let output = Command::new(&binary.path)
        .current_dir(&binary.crate_dir)
        .env("CARGO_MANIFEST_DIR", &binary.crate_dir)
        .arg("--show-output")
        .args(extra)
        .output();
    run.elapsed = started.elapsed();
    let output = match output {
        Ok(o) => o,
        Err(e) => {
            println!(
                "{}: could not start {}: {e}",
                binary.name,
                binary.path.display()
            );
            return run;
        }
    };
    run.exit_ok = output.status.success();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    parse_libtest(&text, &mut run);
    if !run.ok() {
        println!("\n---- {} FAILED ({}) ----", binary.name, output.status);
        let lines: Vec<&str> = text.lines().collect();
        for line in &lines[lines.len().saturating_sub(80)..] {
            println!("{line}");
        }
    }
    run
}

fn run_doctests(root: &Path) -> TestRun {
    let mut run = TestRun {
        name: "doctests (cargo test --doc)".into(),
        ..TestRun::default()
    };
    eprintln!("--> doctests");
    let started = Instant::now();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(root)
        .args(["test", "--workspace", "--doc"])
        .output();
    run.elapsed = started.elapsed();
    match output {
        Ok(o) => {
            run.exit_ok = o.status.success();
            let text = format!(
                "{}\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            parse_libtest(&text, &mut run);
            if !run.ok() {
                println!("\n---- doctests FAILED ----\n{text}");
            }
        }
        Err(e) => println!("doctests: could not run cargo: {e}"),
    }
    run
}

fn print_summary(runs: &[TestRun]) {
    println!("\n== summary ==");
    println!(
        "{:<44} {:>6} {:>6} {:>7} {:>7} {:>8}  status",
        "test binary", "passed", "failed", "ignored", "skipped", "time"
    );
    let mut total = TestRun::default();
    for r in runs {
        println!(
            "{:<44} {:>6} {:>6} {:>7} {:>7} {:>7.1}s  {}",
            r.name,
            r.passed,
            r.failed,
            r.ignored,
            r.skipped,
            r.elapsed.as_secs_f64(),
            if r.ok() {
                "ok"
            } else if !r.saw_summary {
                "FAILED (no libtest summary: crashed or did not start)"
            } else {
                "FAILED"
            }
        );
        total.passed += r.passed;
        total.failed += r.failed;
        total.ignored += r.ignored;
        total.skipped += r.skipped;
        total.elapsed += r.elapsed;
    }
    let failed_binaries = runs.iter().filter(|r| !r.ok()).count();
    println!(
        "{:<44} {:>6} {:>6} {:>7} {:>7} {:>7.1}s  {}",
        "TOTAL",
        total.passed,
        total.failed,
        total.ignored,
        total.skipped,
        total.elapsed.as_secs_f64(),
        if failed_binaries == 0 {
            "PASS".to_string()
        } else {
            format!("FAIL ({failed_binaries} binaries)")
        }
    );
    let reasons: Vec<(&str, &String)> = runs
        .iter()
        .flat_map(|r| r.skip_reasons.iter().map(move |s| (r.name.as_str(), s)))
        .collect();
    if !reasons.is_empty() {
        println!("\nskipped (passed tests that printed a reason):");
        for (name, reason) in reasons {
            println!("  [{name}] {reason}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_summaries_and_skips_are_counted() {
        let output = "running 3 tests\n---- a stdout ----\nskipping: a: no GPU found (x)\n\n\
                      test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; \
                      finished in 0.01s\n";
        let mut run = TestRun::default();
        parse_libtest(output, &mut run);
        assert_eq!(
            (run.passed, run.failed, run.ignored, run.skipped),
            (3, 0, 1, 1)
        );
        assert!(run.saw_summary);

        let failing = "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; \
                       0 filtered out; finished in 0.5s\n";
        let mut run = TestRun {
            exit_ok: false,
            ..TestRun::default()
        };
        parse_libtest(failing, &mut run);
        assert_eq!((run.passed, run.failed), (2, 1));
        assert!(!run.ok());
    }

    #[test]
    fn a_binary_without_summary_is_a_failure() {
        let mut run = TestRun {
            exit_ok: true,
            ..TestRun::default()
        };
        parse_libtest("thread 'main' panicked\n", &mut run);
        assert!(!run.ok());
    }
}
