//! The self-test table (`rocm_kernels::selftest`) on the GPU: every case against its CPU
//! reference, and every entry point of the source list launched by some case. This is where
//! the kernels' comparisons with their references live; the other GPU test binaries keep what
//! is not a comparison (refused shapes, timings). Skips with a printed reason without a GPU
//! (fails under `HIPDECODE_REQUIRE_GPU=1`).

mod common;

use rocm_kernels::selftest::{self, CaseOutcome, RunOptions};

#[test]
fn every_kernel_matches_its_reference_and_every_entry_point_runs() {
    let test = "every_kernel_matches_its_reference_and_every_entry_point_runs";
    let _one_at_a_time = test_support::gpu::gpu_lock();
    let Some((kernels, _stream)) = common::setup(test) else {
        return;
    };
    let print = &mut |o: &CaseOutcome| {
        let verdict = if o.passed() { "ok  " } else { "FAIL" };
        let error = o
            .max_error()
            .map_or(String::new(), |e| format!(" max error {e:.3e}"));
        eprintln!(
            "{verdict} {:<14} {} ({:.2?}){error}",
            o.op, o.name, o.elapsed
        );
        for check in o.checks.iter().filter(|c| !c.passed) {
            eprintln!("       {}: {}", check.what, check.detail);
        }
        if let Some(e) = &o.error {
            eprintln!("       {e}");
        }
    };
    // The environment's break switch is the CLI test's; this one runs the table unbroken.
    let simt = common::simt_kernels(test, kernels.device());
    let report = selftest::run(
        kernels,
        simt,
        &selftest::cases(),
        &RunOptions::default(),
        print,
    )
    .expect("the table runs");
    eprintln!("{} cases in {:.2?}", report.outcomes.len(), report.elapsed);
    let failed: Vec<String> = report
        .failures()
        .iter()
        .map(|o| format!("{} ({}): {}", o.name, o.op, o.failure().unwrap_or_default()))
        .collect();
    assert!(
        failed.is_empty(),
        "{} cases failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert!(
        report.not_launched.is_empty(),
        "{} entry points were launched by no case: {}",
        report.not_launched.len(),
        report.not_launched.join(", ")
    );
}
