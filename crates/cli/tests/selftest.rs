//! `hipdecode selftest` as a user runs it: without a GPU it says why and exits 2; on a GPU it
//! passes, and with one op perturbed (`HIPDECODE_SELFTEST_BREAK`) it names that op alone, with
//! its max error, and exits 1. The GPU tests skip with a printed reason without a GPU (fail
//! under `HIPDECODE_REQUIRE_GPU=1`).

use std::process::{Command, Output};

fn selftest(env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hipdecode"));
    command.arg("selftest").args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().expect("hipdecode runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn without_a_gpu_the_selftest_says_why_and_exits_2() {
    // No platform is probed under HIPDECODE_PLATFORM=none, GPU or not.
    let out = selftest(&[("HIPDECODE_PLATFORM", "none")], &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("no usable GPU") && stderr.contains("HIPDECODE_PLATFORM=none"),
        "{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "nothing ran, so no table: {}",
        text(&out.stdout)
    );
}

#[test]
fn a_break_value_that_names_no_op_is_refused_with_the_ops() {
    let out = selftest(
        &[
            ("HIPDECODE_PLATFORM", "none"),
            ("HIPDECODE_SELFTEST_BREAK", "no_such_op"),
        ],
        &[],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("HIPDECODE_SELFTEST_BREAK") && stderr.contains("rms_norm"),
        "{stderr}"
    );
}

/// The table's rows, op first, from the output before the report.
fn rows(stdout: &str) -> Vec<Vec<String>> {
    stdout
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("----") && !l.starts_with("not run"))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[test]
fn on_a_gpu_the_selftest_passes_with_a_report() {
    let test = "on_a_gpu_the_selftest_passes_with_a_report";
    let _one_at_a_time = test_support::gpu::gpu_lock();
    if hip_ffi::testing::device_or_skip(test).is_none() {
        return;
    }
    let out = selftest(&[], &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    eprintln!("{stderr}\n{stdout}");
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let rows = rows(&stdout);
    assert!(
        rows.iter().any(|r| r[0] == "model"),
        "no model rows:\n{stdout}"
    );
    assert!(rows.iter().all(|r| r[2] == "pass"), "{stdout}");
    for key in [
        "platform:",
        "architecture:",
        "wave size:",
        "XNACK:",
        "VRAM:",
        "GTT:",
        "kernel cache:",
        "result: PASS",
    ] {
        assert!(stdout.contains(key), "the report lacks {key}:\n{stdout}");
    }
}

#[test]
fn a_broken_op_is_reported_alone_with_its_max_error_and_exit_status_1() {
    let test = "a_broken_op_is_reported_alone_with_its_max_error_and_exit_status_1";
    let _one_at_a_time = test_support::gpu::gpu_lock();
    if hip_ffi::testing::device_or_skip(test).is_none() {
        return;
    }
    let out = selftest(&[("HIPDECODE_SELFTEST_BREAK", "softcap")], &["--no-models"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    eprintln!("{stderr}\n{stdout}");
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let rows = rows(&stdout);
    let failed: Vec<&Vec<String>> = rows.iter().filter(|r| r[2] != "pass").collect();
    assert_eq!(failed.len(), 1, "one op fails:\n{stdout}");
    assert_eq!(failed[0][0], "softcap", "{stdout}");
    // The perturbation moves one value by more than 1: the max error, the row's last column,
    // says so (the time before it is two words, "9.2 ms").
    let max_error: f64 = failed[0]
        .last()
        .and_then(|e| e.parse().ok())
        .expect("a max error in the row");
    assert!(max_error >= 1.0, "{stdout}");
    let report_failures: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("failed: "))
        .collect();
    assert!(
        !report_failures.is_empty() && report_failures.iter().all(|l| l.contains("(softcap)")),
        "{stdout}"
    );
}
