//! `cargo xtask verify-rocm`: platform report plus the whole test suite.
//!
//! Prints the detected platform, every visible device with its attributes and memory figures,
//! then runs every test binary of the workspace (built by cargo here, or prebuilt with
//! `cargo xtask bundle` and passed as `--bundle DIR` on a machine without cargo), each from its
//! crate directory, and prints a per-binary pass/fail/skip table. Exits non-zero on any failure.
//! Without a GPU it says so and runs the same suite: the GPU tests skip themselves with a
//! printed reason, which is counted in the "skipped" column (and in "GPU skips").
//!
//! On a machine that is meant to have a GPU, `HIPDECODE_REQUIRE_GPU=1` (or `--require-gpu`)
//! makes a missing or unusable GPU a failure: the variable is passed on to the test binaries,
//! whose GPU tests then fail instead of skipping, and the run fails when no GPU is usable or any
//! test still printed a GPU skip. A GPU whose device node exists but which the runtime cannot
//! use (a driver older than the runtime, a failed initialisation) is reported as
//! `GPU present but unusable: <why>`.

use anyhow::{bail, Context, Result};
const REQUIRE_GPU_VAR: &str = hip_ffi::knobs::REQUIRE_GPU.name;
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
    /// Fail unless a GPU is usable and no test skips for lack of one (the same as
    /// HIPDECODE_REQUIRE_GPU=1, which is passed on to the test binaries).
    #[arg(long)]
    pub require_gpu: bool,
    /// Arguments passed to every test binary (a name filter, `--test-threads=1`, ...).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub test_args: Vec<String>,
}

pub fn run(args: Args) -> Result<()> {
    let require_gpu = args.require_gpu || hip_ffi::knobs::REQUIRE_GPU.read()?;
    let gpu = print_platform_report();
    if args.no_tests {
        return match (&gpu, require_gpu) {
            (GpuStatus::Usable, _) | (_, false) => Ok(()),
            (_, true) => bail!("{REQUIRE_GPU_VAR}=1 but {}", gpu.describe()),
        };
    }
    match &gpu {
        GpuStatus::Usable => {}
        _ if require_gpu => println!(
            "\n{REQUIRE_GPU_VAR}=1 and no GPU is usable: the run will FAIL; running the suite \
             anyway for the CPU results."
        ),
        _ => println!(
            "\nNo usable GPU: running the CPU part of the test suite; GPU tests skip themselves \
             with a printed reason (counted as skipped)."
        ),
    }
    let root = match &args.bundle {
        // The bundle sits in the checkout root; its crate paths are relative to that root.
        Some(bundle) => std::fs::canonicalize(bundle)
            .with_context(|| format!("bundle folder {}", bundle.display()))?
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(crate::workspace_root),
        None => crate::workspace_root(),
    };
    let mut build_failed = false;
    let binaries = match &args.bundle {
        Some(bundle) => {
            let bundle = std::fs::canonicalize(bundle)?;
            let manifest = crate::bundle::read_manifest(&bundle)?;
            // Link first: the programs' build paths may lie under the build root.
            match &manifest.build_root {
                Some(build_root) => crate::bundle::link_build_root(build_root, &root)?,
                None => println!(
                    "\nWARNING: this bundle's manifest does not record its build root (it predates \
                     that field); tests that read files by their compile-time path may fail. \
                     Rebuild it with `cargo xtask bundle`."
                ),
            }
            crate::bundle::restore_programs(&bundle)?;
            if !manifest.complete {
                build_failed = true;
                println!(
                    "\nWARNING: this bundle is incomplete: some test targets failed to build \
                     when it was made, so their tests are missing (counted as a failure)."
                );
            }
            manifest
                .tests
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
        .map(|b| run_binary(b, &args.test_args, require_gpu))
        .collect();
    if args.bundle.is_none() {
        runs.push(run_doctests(&root, require_gpu));
    }
    print_summary(&runs);
    let problems = verdict(require_gpu, &gpu, &runs, build_failed);
    if problems.is_empty() {
        println!("\nRESULT: PASS");
        return Ok(());
    }
    println!("\nRESULT: FAIL");
    for problem in &problems {
        println!("  - {problem}");
    }
    bail!("verify-rocm failed: {}", problems.join("; "))
}

/// Whether the tests can use a GPU, and if not, why.
#[derive(Debug, PartialEq, Eq)]
enum GpuStatus {
    /// A platform was found and its first device answers.
    Usable,
    /// A GPU device node exists (`hardware`), but no runtime can use it (`why`).
    Unusable { hardware: String, why: String },
    /// No GPU on this machine as far as the runtimes and device nodes tell.
    Absent { why: String },
}

impl GpuStatus {
    /// Classifies the probe results: `unusable` is the platform's (or first device's) reason
    /// when no GPU can be used; `hardware` names a GPU device node that exists.
    fn classify(unusable: Option<String>, hardware: Option<String>) -> GpuStatus {
        match (unusable, hardware) {
            (None, _) => GpuStatus::Usable,
            (Some(why), Some(hardware)) => GpuStatus::Unusable { hardware, why },
            (Some(why), None) => GpuStatus::Absent { why },
        }
    }

    /// One line for the report and for failure messages.
    fn describe(&self) -> String {
        match self {
            GpuStatus::Usable => "a GPU is usable".into(),
            GpuStatus::Unusable { hardware, why } => {
                format!("GPU present but unusable: {why} (device node {hardware} exists)")
            }
            GpuStatus::Absent { why } => format!("no GPU found: {why}"),
        }
    }
}

/// Device nodes that exist only when a GPU kernel driver has bound a device: AMD's KFD (what
/// ROCm opens) and NVIDIA's control and first-device nodes.
const GPU_DEVICE_NODES: [&str; 3] = ["/dev/kfd", "/dev/nvidiactl", "/dev/nvidia0"];

fn gpu_device_node() -> Option<String> {
    GPU_DEVICE_NODES
        .iter()
        .find(|node| Path::new(node).exists())
        .map(|node| node.to_string())
}

/// Why the runs fail, empty when they pass: failed binaries, an incomplete build, and with
/// `require_gpu` an unusable GPU or any test that skipped for lack of one.
fn verdict(
    require_gpu: bool,
    gpu: &GpuStatus,
    runs: &[TestRun],
    build_failed: bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    let failed: Vec<&str> = runs
        .iter()
        .filter(|r| !r.ok())
        .map(|r| r.name.as_str())
        .collect();
    if !failed.is_empty() {
        problems.push(format!(
            "{} test binaries failed: {}",
            failed.len(),
            failed.join(", ")
        ));
    }
    if build_failed {
        problems.push("some test targets did not build, so the suite is incomplete".into());
    }
    if require_gpu {
        if *gpu != GpuStatus::Usable {
            problems.push(format!("{REQUIRE_GPU_VAR}=1 but {}", gpu.describe()));
        }
        let gpu_skips: u32 = runs.iter().map(|r| r.gpu_skipped).sum();
        if gpu_skips > 0 {
            problems.push(format!(
                "{REQUIRE_GPU_VAR}=1 but {gpu_skips} tests skipped for lack of a GPU (listed \
                 under \"skipped\" above)"
            ));
        }
    }
    problems
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

/// Prints platform and devices; returns whether a GPU is usable, and why not.
fn print_platform_report() -> GpuStatus {
    println!("== hipdecode verify-rocm ==");
    println!("host: {} {}", std::env::consts::OS, std::env::consts::ARCH);
    for var in [
        "HIP_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        hip_ffi::knobs::PLATFORM.name,
        REQUIRE_GPU_VAR,
    ] {
        let value = match var.strip_prefix(knobs::PREFIX) {
            Some(_) => knobs::Env::process()
                .get(var)
                .map(|v| v.unwrap_or("<unset>").to_string())
                .unwrap_or_else(|e| e.to_string()),
            // The runtimes' own variables, which no knob defines.
            None => std::env::var(var).unwrap_or_else(|_| "<unset>".into()),
        };
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
    let mut unusable = platform.unusable_reason();
    if platform.kind() != PlatformKind::None {
        println!("devices: {}", platform.device_count());
        for ordinal in 0..platform.device_count() {
            match platform.device(ordinal) {
                Ok(device) => print_device(ordinal, &device),
                Err(e) => println!("device {ordinal}: {e}"),
            }
        }
        // The platform answered; the first device (the one the tests take) must too.
        if let Err(e) = platform.device(0).and_then(|d| d.attributes()) {
            unusable = Some(format!("device 0 does not answer: {e}"));
        }
    }
    let status = GpuStatus::classify(unusable, gpu_device_node());
    if status != GpuStatus::Usable {
        println!("{}", status.describe());
    }
    status
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
    if let Ok(v) = std::env::var(hip_ffi::sysfs::HSA_OVERRIDE_GFX_VERSION) {
        row(
            "HSA_OVERRIDE_GFX_VERSION",
            format!("{v:?} (kernels are compiled for the arch above, not the card's own)"),
        );
    }
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
    /// Skips whose reason is the lack of a usable GPU (a subset of `skipped`).
    gpu_skipped: u32,
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
        } else if is_skip_line(trimmed) {
            run.skipped += 1;
            if is_gpu_skip(trimmed) {
                run.gpu_skipped += 1;
            }
            run.skip_reasons.push(trimmed.to_string());
        }
    }
}

/// A test's printed skip: `skipping...` (the older form) or `SKIP <test>: <reason>`
/// (`hip_ffi::testing::device_or_skip`).
fn is_skip_line(line: &str) -> bool {
    line.to_ascii_lowercase().starts_with("skipping") || line.starts_with("SKIP ")
}

/// Whether a skip line gives the lack of a usable GPU as its reason. GPU skips name the GPU
/// ("no GPU", "no GPU is usable") or carry the platform probe's notes ("AMD: ...",
/// "NVIDIA: ..."); other skips (a missing model, a missing compiler library) do neither.
fn is_gpu_skip(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    ["gpu", "amd:", "nvidia:"]
        .iter()
        .any(|marker| lower.contains(marker))
}

fn run_binary(binary: &TestBinary, extra: &[String], require_gpu: bool) -> TestRun {
    let mut run = TestRun {
        name: binary.name.clone(),
        ..TestRun::default()
    };
    eprintln!("--> {}", binary.name);
    let started = Instant::now();
    let output = Command::new(&binary.path)
        .current_dir(&binary.crate_dir)
        .env("CARGO_MANIFEST_DIR", &binary.crate_dir)
        .env(REQUIRE_GPU_VAR, if require_gpu { "1" } else { "0" })
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

fn run_doctests(root: &Path, require_gpu: bool) -> TestRun {
    let mut run = TestRun {
        name: "doctests (cargo test --doc)".into(),
        ..TestRun::default()
    };
    eprintln!("--> doctests");
    let started = Instant::now();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(root)
        .env(REQUIRE_GPU_VAR, if require_gpu { "1" } else { "0" })
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

fn run_status(r: &TestRun) -> &'static str {
    if r.ok() {
        "ok"
    } else if !r.saw_summary {
        "FAILED (no libtest summary: crashed or did not start)"
    } else {
        "FAILED"
    }
}

fn print_summary(runs: &[TestRun]) {
    println!("\n== summary ==");
    let row = |name: &str, r: &TestRun, status: &str| {
        println!(
            "{:<44} {:>6} {:>6} {:>7} {:>7} {:>9} {:>7.1}s  {status}",
            name,
            r.passed,
            r.failed,
            r.ignored,
            r.skipped,
            r.gpu_skipped,
            r.elapsed.as_secs_f64(),
        )
    };
    println!(
        "{:<44} {:>6} {:>6} {:>7} {:>7} {:>9} {:>8}  status",
        "test binary", "passed", "failed", "ignored", "skipped", "GPU skips", "time"
    );
    let mut total = TestRun::default();
    for r in runs {
        row(&r.name, r, run_status(r));
        total.passed += r.passed;
        total.failed += r.failed;
        total.ignored += r.ignored;
        total.skipped += r.skipped;
        total.gpu_skipped += r.gpu_skipped;
        total.elapsed += r.elapsed;
    }
    let failed: Vec<&TestRun> = runs.iter().filter(|r| !r.ok()).collect();
    let total_status = if failed.is_empty() {
        "all binaries ok".to_string()
    } else {
        format!("{} binaries FAILED", failed.len())
    };
    row("TOTAL", &total, &total_status);
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
    if !failed.is_empty() {
        println!("\n!!!!!!!! {} TEST BINARIES FAILED !!!!!!!!", failed.len());
        for r in &failed {
            println!(
                "  FAILED {}: {} (its output is above, under \"---- {} FAILED\")",
                r.name,
                run_status(r),
                r.name
            );
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

    fn passing_run(output: &str) -> TestRun {
        let mut run = TestRun {
            name: "crate/target".into(),
            exit_ok: true,
            ..TestRun::default()
        };
        parse_libtest(output, &mut run);
        run
    }

    const OK_SUMMARY: &str = "test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; \
                              0 filtered out; finished in 0.01s\n";

    #[test]
    fn gpu_skips_are_told_apart_from_other_skips() {
        let output = format!(
            "SKIP launches_a_kernel: NVIDIA: cuInit failed: CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE\n\
             skipping HIP allocator tests: no GPU (no GPU platform was found)\n\
             skipping: Gemma 3 270M is absent (run `cargo xtask fetch-model gemma3-270m`)\n\
             SKIP compiles_every_kernel: libhiprtc.so.5 not found; install libhiprtc-builtins5\n\
             {OK_SUMMARY}"
        );
        let run = passing_run(&output);
        assert_eq!((run.skipped, run.gpu_skipped), (4, 2));
        assert!(run.ok());
    }

    #[test]
    fn a_required_gpu_fails_on_any_gpu_skip_or_an_unusable_gpu() {
        let skipped = passing_run(&format!("SKIP t: no GPU is usable: AMD: x\n{OK_SUMMARY}"));
        let clean = passing_run(OK_SUMMARY);
        let usable = GpuStatus::Usable;

        // Not required: GPU skips pass, with or without a GPU.
        assert!(verdict(false, &usable, std::slice::from_ref(&skipped), false).is_empty());
        let absent = GpuStatus::classify(Some("no library".into()), None);
        assert!(verdict(false, &absent, std::slice::from_ref(&skipped), false).is_empty());

        // Required: a GPU skip fails even when the platform looked usable.
        let problems = verdict(true, &usable, std::slice::from_ref(&skipped), false);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("1 tests skipped for lack of a GPU"),
            "{problems:?}"
        );

        // Required: an unusable GPU fails even when no test printed a skip.
        let unusable = GpuStatus::classify(
            Some("NVIDIA: driver 535 is older than the runtime".into()),
            Some("/dev/nvidia0".into()),
        );
        let problems = verdict(true, &unusable, std::slice::from_ref(&clean), false);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("HIPDECODE_REQUIRE_GPU=1 but GPU present but unusable")
                && problems[0].contains("driver 535"),
            "{problems:?}"
        );
        assert!(verdict(true, &usable, &[clean], false).is_empty());
    }

    #[test]
    fn failed_binaries_and_an_incomplete_build_fail_the_run() {
        let mut broken = passing_run("thread 'main' panicked\n");
        broken.name = "decode/decode".into();
        let problems = verdict(false, &GpuStatus::Usable, &[broken], true);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("decode/decode"), "{problems:?}");
        assert!(problems[1].contains("did not build"), "{problems:?}");
    }

    #[test]
    fn a_gpu_with_a_device_node_but_no_runtime_is_present_but_unusable() {
        assert_eq!(GpuStatus::classify(None, None), GpuStatus::Usable);
        let unusable =
            GpuStatus::classify(Some("AMD: hipInit failed".into()), Some("/dev/kfd".into()));
        assert!(
            unusable
                .describe()
                .starts_with("GPU present but unusable: AMD: hipInit failed"),
            "{}",
            unusable.describe()
        );
        let absent = GpuStatus::classify(Some("AMD: libamdhip64.so not found".into()), None);
        assert!(
            absent.describe().starts_with("no GPU found: "),
            "{}",
            absent.describe()
        );
    }
}
