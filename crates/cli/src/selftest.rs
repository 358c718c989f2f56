//! `hipdecode selftest`: every kernel of the source list run on this machine's GPU against its
//! CPU reference (`rocm_kernels::selftest`, the table the GPU tests run), then one tiny
//! synthetic model of each architecture, GPU against CPU. Prints a pass/fail table and a short
//! report to paste into an issue.
//!
//! Exit status: 0 when everything passed, 1 when anything failed, 2 when there is no usable
//! GPU (with the reason).

use anyhow::{Context, Result};
use hip_ffi::{Device, Platform};
use rocm_kernels::cache::KernelCache;
use rocm_kernels::selftest::{self, CaseOutcome, RunOptions};
use rocm_kernels::Kernels;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Exit status without a usable GPU.
const NO_GPU: u8 = 2;

#[derive(clap::Args)]
pub struct SelftestArgs {
    /// Run only the cases whose op or name contains this text (the coverage check is then
    /// skipped).
    #[arg(long)]
    filter: Option<String>,
    /// Skip the tiny models (kernels only).
    #[arg(long)]
    no_models: bool,
}

/// Runs the self-test; the exit status says how it went (see the module docs). With `verbose`
/// (`-v`), it also lists each kernel's registers, local and shared memory.
pub fn selftest(args: &SelftestArgs, verbose: bool) -> ExitCode {
    // A bad switch is an error before anything else, GPU or not.
    let options = match RunOptions::from_env() {
        Ok(options) => RunOptions {
            filter: args.filter.clone(),
            ..options
        },
        Err(e) => return decode::error_report::exit(Err(e.into())),
    };
    let platform = Platform::detect();
    let device = match platform.device(0) {
        Ok(device) => device,
        Err(e) => {
            let reason = platform
                .unusable_reason()
                .unwrap_or_else(|| e.detail.clone().unwrap_or_else(|| e.to_string()));
            eprintln!("selftest: no usable GPU, nothing was run: {reason}");
            return ExitCode::from(NO_GPU);
        }
    };
    match run(args, &options, verbose, platform, &device) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => decode::error_report::exit(Err(e)),
    }
}

/// Everything after the device was found; `Ok(passed)`.
fn run(
    args: &SelftestArgs,
    options: &RunOptions,
    verbose: bool,
    platform: &Platform,
    device: &Device,
) -> Result<bool> {
    let facts = facts(platform, device);
    let cache = KernelCache::from_env().context("the kernel cache")?;
    let cache_path = cache
        .dir()
        .map_or("off (compiled every time)".to_string(), |d| {
            d.display().to_string()
        });
    eprintln!("selftest: compiling or loading the kernels (cache: {cache_path})");
    let started = Instant::now();
    let kernels = Kernels::load(device, &cache).context("loading the kernels")?;
    // The build the native matrix-core kernels are checked against, compiled here so the
    // cases' time is theirs alone.
    let simt_build = selftest::load_simt(&kernels, &cache).context("loading the SIMT kernels")?;
    let simt = simt_build.as_ref().unwrap_or(&kernels);
    let load_time = started.elapsed();
    eprintln!(
        "selftest: kernels ready in {} (wave size {}, matrix cores: {:?})",
        crate::load_progress::seconds(load_time),
        kernels.wave_size(),
        kernels.mma_variant()
    );

    let cases = selftest::cases();
    let bar = progress_bar(cases.len() as u64);
    let report = selftest::run(&kernels, simt, &cases, options, &mut |outcome| {
        bar.inc(1);
        if !outcome.passed() {
            bar.suspend(|| eprintln!("FAIL {}", describe_failure(outcome)));
        }
    })
    .context("running the kernel table")?;
    bar.finish_and_clear();

    let models = if args.no_models || args.filter.is_some() {
        Vec::new()
    } else {
        eprintln!("selftest: tiny models, GPU against CPU");
        decode::selftest::check_tiny_models(device, &mut |name| eprintln!("  {name}"))
            .context("the tiny models")?
    };

    let mut all: Vec<&CaseOutcome> = report.outcomes.iter().collect();
    all.extend(models.iter());
    let passed = report.passed() && models.iter().all(CaseOutcome::passed);
    println!("{}", table(&all));
    if !report.not_launched.is_empty() {
        println!(
            "not run: {} entry points no case launched: {}",
            report.not_launched.len(),
            report.not_launched.join(", ")
        );
    }
    if verbose {
        let usage = kernels
            .resources()
            .context("reading the kernels' resources")?;
        println!("{}", resource_table(&usage));
    }
    println!(
        "{}",
        shareable_report(
            &facts,
            &kernels,
            &cache_path,
            load_time,
            &report,
            &all,
            passed
        )
    );
    Ok(passed)
}

fn progress_bar(len: u64) -> indicatif::ProgressBar {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template("kernels {bar:30} {pos}/{len} cases, {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

fn describe_failure(o: &CaseOutcome) -> String {
    let error = o
        .max_error()
        .map_or(String::new(), |e| format!(", max error {e:.3e}"));
    format!(
        "{} ({}){error}: {}",
        o.name,
        o.op,
        o.failure().unwrap_or_default()
    )
}

/// One row per op: cases, how many passed, the largest error of a failure (or of all), time.
fn table(outcomes: &[&CaseOutcome]) -> String {
    struct Row {
        cases: usize,
        passed: usize,
        max_error: Option<f64>,
        time: Duration,
    }
    let mut rows: BTreeMap<&str, Row> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for o in outcomes {
        let row = rows.entry(o.op).or_insert_with(|| {
            order.push(o.op);
            Row {
                cases: 0,
                passed: 0,
                max_error: None,
                time: Duration::ZERO,
            }
        });
        row.cases += 1;
        row.passed += usize::from(o.passed());
        row.time += o.elapsed;
        if let Some(e) = o.max_error().filter(|_| !o.passed()) {
            row.max_error = Some(row.max_error.map_or(e, |m| m.max(e)));
        }
    }
    let mut out = format!(
        "{:<22} {:>6} {:>7} {:>10} {:>12}\n",
        "op", "cases", "result", "time", "max error"
    );
    for op in order {
        let r = &rows[op];
        let verdict = if r.passed == r.cases { "pass" } else { "FAIL" };
        let error = r.max_error.map_or("-".to_string(), |e| format!("{e:.3e}"));
        let _ = writeln!(
            out,
            "{op:<22} {:>6} {verdict:>7} {:>10} {error:>12}",
            r.cases,
            crate::load_progress::seconds(r.time)
        );
    }
    out
}

/// One row per kernel: registers (and on AMD scalar registers and spills), local and shared
/// memory, the largest block.
fn resource_table(usage: &[rocm_kernels::KernelUsage]) -> String {
    let opt = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
    let mut out = format!(
        "{:<32} {:>6} {:>6} {:>7} {:>9} {:>9} {:>9}\n",
        "kernel", "regs", "sregs", "spills", "local B", "shared B", "max block"
    );
    for u in usage {
        let _ = writeln!(
            out,
            "{:<32} {:>6} {:>6} {:>7} {:>9} {:>9} {:>9}",
            u.name,
            u.registers,
            opt(u.scalar_registers),
            opt(u.spilled_registers),
            u.local_bytes,
            u.shared_bytes,
            u.max_block
        );
    }
    if usage.is_empty() {
        out.push_str("(the platform reported no kernel's resources)\n");
    }
    out
}

/// What a report needs about the machine, in order.
fn facts(platform: &Platform, device: &Device) -> Vec<(&'static str, String)> {
    let mut facts = vec![
        ("platform", platform.kind().to_string()),
        (
            "runtime and driver",
            platform.version().unwrap_or_else(|| "unknown".into()),
        ),
    ];
    match device.attributes() {
        Ok(a) => {
            let arch = a.arch.clone().unwrap_or_else(|| "not reported".into());
            facts.push(("device", a.name.clone()));
            facts.push(("architecture", arch.clone()));
            facts.push(("wave size", a.warp_size.to_string()));
            facts.push(("XNACK", xnack(&arch)));
            facts.push((
                "kind",
                if a.integrated {
                    "APU (integrated, memory shared with the host)".into()
                } else {
                    "discrete".into()
                },
            ));
            facts.push((
                "VRAM",
                format!(
                    "{} (the runtime's total memory)",
                    decode::memory::human_bytes(a.total_memory)
                ),
            ));
            let gtt = device.mem_get_info().ok().and_then(|m| m.gtt);
            facts.push((
                "GTT",
                match gtt {
                    Some(g) => format!(
                        "{} total, {} used (sysfs mem_info_gtt of the PCI device)",
                        decode::memory::human_bytes(g.total),
                        decode::memory::human_bytes(g.used)
                    ),
                    None => "n/a (no amdgpu sysfs entry for this device)".into(),
                },
            ));
        }
        Err(e) => facts.push(("device", format!("attributes unavailable: {e}"))),
    }
    facts.push((
        hip_ffi::sysfs::HSA_OVERRIDE_GFX_VERSION,
        std::env::var(hip_ffi::sysfs::HSA_OVERRIDE_GFX_VERSION).unwrap_or_else(|_| "unset".into()),
    ));
    facts.push((
        "compile options",
        hip_ffi::device_compile_options(device)
            .map(|o| o.join(" "))
            .unwrap_or_else(|e| format!("unavailable: {e}")),
    ));
    facts
}

/// The XNACK mode an AMD target name states (`gfx90a:sramecc+:xnack-`), else what decides it.
fn xnack(arch: &str) -> String {
    let env = std::env::var("HSA_XNACK").map_or("unset".to_string(), |v| format!("{v:?}"));
    if arch.contains("xnack+") {
        "on (xnack+ in the target)".into()
    } else if arch.contains("xnack-") {
        "off (xnack- in the target)".into()
    } else if arch.starts_with("gfx") {
        format!("not stated by the target (HSA_XNACK {env})")
    } else {
        "n/a (not an AMD target)".into()
    }
}

/// The block to paste into an issue: the machine, the run, and each failure with its error.
fn shareable_report(
    facts: &[(&'static str, String)],
    kernels: &Kernels,
    cache_path: &str,
    load_time: Duration,
    report: &selftest::Report,
    outcomes: &[&CaseOutcome],
    passed: bool,
) -> String {
    let mut out = String::from("---- hipdecode selftest report ----\n");
    let _ = writeln!(out, "hipdecode {}", env!("CARGO_PKG_VERSION"));
    for (key, value) in facts {
        let _ = writeln!(out, "{key}: {value}");
    }
    let _ = writeln!(out, "matrix-core variant: {:?}", kernels.mma_variant());
    let _ = writeln!(out, "kernel cache: {cache_path}");
    let models: Duration = outcomes
        .iter()
        .filter(|o| o.op == "model")
        .map(|o| o.elapsed)
        .sum();
    let _ = writeln!(
        out,
        "kernels compiled or loaded in {}; the kernel table ran in {}, the tiny models in {}",
        crate::load_progress::seconds(load_time),
        crate::load_progress::seconds(report.elapsed),
        crate::load_progress::seconds(models)
    );
    let failed: Vec<&&CaseOutcome> = outcomes.iter().filter(|o| !o.passed()).collect();
    let _ = writeln!(
        out,
        "result: {} ({} of {} cases passed; {} entry points not run)",
        if passed { "PASS" } else { "FAIL" },
        outcomes.len() - failed.len(),
        outcomes.len(),
        report.not_launched.len()
    );
    for o in failed {
        let _ = writeln!(out, "failed: {}", describe_failure(o));
    }
    out.push_str("---- end of report ----");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocm_kernels::selftest::Check;

    fn outcome(op: &'static str, name: &'static str, error: Option<f64>) -> CaseOutcome {
        let check = match error {
            None => Check::new("values", Some(1e-7), true, "ok"),
            Some(e) => Check::new("values", Some(e), false, "beyond the bound"),
        };
        CaseOutcome {
            name,
            op,
            checks: vec![check],
            error: None,
            elapsed: Duration::from_millis(3),
        }
    }

    #[test]
    fn the_table_has_one_row_per_op_with_the_failures_largest_error() {
        let a = outcome("rms_norm", "a", None);
        let b = outcome("matvec", "b", Some(0.5));
        let c = outcome("matvec", "c", Some(2.0));
        let text = table(&[&a, &b, &c]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[1].starts_with("rms_norm") && lines[1].contains("pass"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("matvec")
                && lines[2].contains("FAIL")
                && lines[2].contains("2.000e0"),
            "{text}"
        );
    }

    #[test]
    fn the_resource_table_has_a_row_per_kernel_and_dashes_for_what_nvidia_does_not_say() {
        let row = |name, scalar: Option<u32>| rocm_kernels::KernelUsage {
            module: rocm_kernels::KernelModule::Norm,
            name,
            registers: 40,
            scalar_registers: scalar,
            spilled_registers: scalar.map(|_| 0),
            local_bytes: 0,
            shared_bytes: 1024,
            max_block: 256,
        };
        let text = resource_table(&[row("rms_norm_rows", None), row("rms_norm_warp", Some(24))]);
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(
            lines[1],
            ["rms_norm_rows", "40", "-", "-", "0", "1024", "256"]
        );
        assert_eq!(
            lines[2],
            ["rms_norm_warp", "40", "24", "0", "0", "1024", "256"]
        );
        assert!(resource_table(&[]).contains("no kernel"));
    }

    #[test]
    fn xnack_is_read_from_the_target_name() {
        assert!(xnack("gfx90a:sramecc+:xnack-").starts_with("off"));
        assert!(xnack("gfx90a:xnack+").starts_with("on"));
        assert!(xnack("gfx1100").starts_with("not stated"));
        assert!(xnack("sm_90").starts_with("n/a"));
    }
}
