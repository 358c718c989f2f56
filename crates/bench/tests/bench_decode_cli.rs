//! `bench-decode` end to end on the CPU, against a tiny synthetic model: the JSON report, the
//! Markdown tables with the SVG timeline, an --ab run, and clear errors for bad flags.

use decode::gguf_loader::synth::{write_preset, Preset};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A tiny Llama in a scratch directory of its own, removed when the test ends.
struct TinyModel {
    dir: PathBuf,
    path: PathBuf,
}

impl TinyModel {
    fn new(test: &str) -> TinyModel {
        let dir =
            std::env::temp_dir().join(format!("hipdecode-bench-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let path = dir.join("tiny-llama.gguf");
        write_preset(Preset::TinyLlama, &path, 7).expect("write the tiny model");
        TinyModel { dir, path }
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TinyModel {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bench-decode"))
        .args(args)
        // A variable from the caller's environment must not change what is measured here.
        .env_remove("HIPDECODE_FOO")
        .output()
        .expect("bench-decode runs")
}

fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "bench-decode failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn positive_finite(v: &Value) -> bool {
    v.as_f64().is_some_and(|x| x.is_finite() && x > 0.0)
}

#[test]
fn json_report_has_both_tests_with_positive_finite_rates() {
    let tiny = TinyModel::new("json-report");
    let model = tiny.path();
    let out = bench(&[
        "-m",
        model.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "2",
        "-o",
        "json",
        "--device",
        "cpu",
        "--threads",
        "1",
    ]);
    let stdout = ok(&out);
    let v: Value = serde_json::from_str(&stdout).expect("the output is JSON");
    let tests = v.as_array().expect("an array of tests");
    let names: Vec<&str> = tests.iter().map(|t| t["test"].as_str().unwrap()).collect();
    assert_eq!(names, ["pp8", "tg4"]);
    for t in tests {
        assert_eq!(t["model"], "tiny-llama.gguf");
        assert!(t["backend"].as_str().unwrap().starts_with("cpu"), "{t}");
        let ts = t["ts"].as_array().unwrap();
        assert_eq!(ts.len(), 2, "{t}");
        assert!(ts.iter().all(positive_finite), "{t}");
        for key in ["ts_mean", "ts_median", "params", "size_bytes"] {
            assert!(positive_finite(&t[key]), "{key}: {t}");
        }
        assert!(t["ts_sd"].as_f64().is_some_and(f64::is_finite), "{t}");
        // Host memory per tag and the process's RSS, for the test's phase and the load.
        for mem in [&t["memory"], &t["load_memory"]] {
            assert!(
                mem["tags"]["weights"]["peak"].as_u64().unwrap() > 0,
                "{mem}"
            );
            assert!(
                mem["tags"]["kv_cache"]["peak"].as_u64().unwrap() > 0,
                "{mem}"
            );
            assert!(mem["device"].is_null(), "{mem}");
            assert!(mem["rss"].as_u64().unwrap() > 0, "{mem}");
        }
    }
    assert_eq!(tests[0]["memory"]["phase"], "prefill");
    assert_eq!(tests[1]["memory"]["phase"], "decode");
}

#[test]
fn markdown_tables_and_the_svg_timeline() {
    let tiny = TinyModel::new("markdown-tables");
    let model = tiny.path();
    let svg = model.with_file_name("timeline.svg");
    let out = bench(&[
        "-m",
        model.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "1",
        "--warmup",
        "0",
        "--device",
        "cpu",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let stdout = ok(&out);
    assert!(stdout.starts_with("| model "), "{stdout}");
    assert!(
        stdout.contains("| pp8 |") || stdout.contains(" pp8 |"),
        "{stdout}"
    );
    assert!(stdout.contains(" tg4 |"), "{stdout}");
    for phase in ["| load ", "| prefill ", "| decode "] {
        assert!(stdout.contains(phase), "{phase}: {stdout}");
    }
    let doc = std::fs::read_to_string(&svg).expect("the SVG was written");
    assert!(doc.starts_with("<?xml") && doc.trim_end().ends_with("</svg>"));
    assert!(doc.contains(r#"data-tag="weights""#), "{doc}");
    // One marker per phase.
    assert_eq!(doc.matches("stroke-dasharray").count(), 3, "{doc}");
}

#[test]
fn ab_run_prints_a_verdict_per_test() {
    let tiny = TinyModel::new("ab-run");
    let model = tiny.path();
    let out = bench(&[
        "-m",
        model.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "4",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--ab",
        "",
        "HIPDECODE_FOO=1",
        "--rounds",
        "2",
    ]);
    let stdout = ok(&out);
    let verdicts: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("verdict "))
        .collect();
    assert_eq!(verdicts.len(), 2, "{stdout}");
    for v in verdicts {
        assert!(
            v.ends_with(": faster") || v.ends_with(": slower") || v.ends_with(": within noise"),
            "{v}"
        );
    }
    assert!(stdout.contains("B = HIPDECODE_FOO=1"), "{stdout}");
    // The child of arm B saw the variable: decode's environment check warns about it.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("[B] warning: HIPDECODE_FOO"), "{stderr}");
    assert!(!stderr.contains("[A] warning: HIPDECODE_FOO"), "{stderr}");
}

#[test]
fn bad_flags_fail_with_clear_messages_and_no_panic() {
    let tiny = TinyModel::new("bad-flags");
    let model = tiny.path();
    let m = model.to_str().unwrap();
    for (args, expected) in [
        (vec!["-m", m, "-r", "0"], "at least 1"),
        (vec!["-m", m, "-o", "xml"], "possible values: md, json, csv"),
        (vec!["-m", m, "-p", "0", "-n", "0"], "nothing to measure"),
        (vec!["-m", m, "--ab", "", "bogus"], "'bogus'"),
        (vec!["-m", m, "--ab", "", "-o csv"], "A/B driver"),
        (
            vec!["-m", "/nonexistent/x.gguf", "--device", "cpu"],
            "/nonexistent/x.gguf",
        ),
    ] {
        let out = bench(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn alloc_trace_on_the_cpu_is_an_error_that_says_why() {
    let dir = std::env::temp_dir();
    let trace = dir.join(format!("hipdecode-cpu-trace-{}.jsonl", std::process::id()));
    let out = bench(&[
        "-m",
        "no-model-needed.gguf",
        "--device",
        "cpu",
        "--alloc-trace",
        trace.to_str().expect("a UTF-8 temp path"),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--alloc-trace records the GPU allocator's trace")
            && stderr.contains("cpu backend"),
        "{stderr}"
    );
    assert!(!trace.exists(), "no file is written");
}

#[test]
fn sweep_runs_the_chosen_knobs_arms_against_the_reference() {
    let tiny = TinyModel::new("sweep-run");
    let model = tiny.path();
    let out = bench(&[
        "-m",
        model.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "4",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--sweep",
        "--sweep-knobs",
        "graph-pool,trim-window",
        "--rounds",
        "2",
    ]);
    let stdout = ok(&out);
    let arm_rows = stdout
        .lines()
        .filter(|l| {
            l.starts_with("| reference")
                || l.starts_with("| graph-pool")
                || l.starts_with("| trim-window")
        })
        .count();
    assert_eq!(arm_rows, 4, "{stdout}");
    assert!(stdout.contains("tg4 median t/s"), "{stdout}");
    assert!(stdout.contains("HIPDECODE_GRAPH_POOL=shared"), "{stdout}");
    assert!(
        stdout.contains("not measured: async allocation"),
        "{stdout}"
    );
    // An unknown knob is refused before anything runs.
    let out = bench(&["-m", "x.gguf", "--sweep", "--sweep-knobs", "arena"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown knob 'arena'"), "{stderr}");
}

#[test]
fn a_gpu_budget_on_the_cpu_is_an_error_not_ignored() {
    let model = TinyModel::new("budget-cpu");
    let path = model.path().to_str().expect("a UTF-8 temp path");
    let out = bench(&[
        "-m",
        path,
        "-p",
        "0",
        "-n",
        "2",
        "--device",
        "cpu",
        "--gpu-budget",
        "1GiB",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("a GPU budget (--gpu-budget 1GiB) applies to the GPU backend")
            && stderr.contains("--device gpu"),
        "{stderr}"
    );
    let out = bench(&[
        "-m",
        path,
        "-n",
        "2",
        "--device",
        "cpu",
        "--gpu-budget",
        "8 parsecs",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is not a valid GPU budget"), "{stderr}");
}
