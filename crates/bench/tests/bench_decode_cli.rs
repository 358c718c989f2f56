//! `bench-decode` end to end on the CPU, against a tiny synthetic model: the JSON report, the
//! Markdown tables with the SVG timeline, an --ab run, the batched mode (`--npl`) in every
//! format, and clear errors for bad flags; on a GPU, the batched mode's refusal of B > 1.

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

/// bench-decode's JSON for pp8 and tg4, two repetitions each, on one CPU thread, with `extra`
/// flags.
fn small_cpu_json(model: &Path, extra: &[&str]) -> Value {
    let mut args = vec![
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
    ];
    args.extend_from_slice(extra);
    serde_json::from_str(&ok(&bench(&args))).expect("the output is JSON")
}

#[test]
fn json_report_has_both_tests_with_positive_finite_rates() {
    let tiny = TinyModel::new("json-report");
    let model = tiny.path();
    let v = small_cpu_json(model, &[]);
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

/// An `--ab` run of two rounds on a tiny model on the CPU (one thread), with `measure` as the
/// measurement flags and `arm_b` against the baseline. The model is returned so its file
/// lives as long as the caller looks at the run.
fn ab_on_cpu(name: &str, measure: &[&str], arm_b: &str) -> (TinyModel, Output) {
    let tiny = TinyModel::new(name);
    let model = tiny.path();
    let mut args = vec!["-m", model.to_str().unwrap()];
    args.extend_from_slice(measure);
    args.extend([
        "--device",
        "cpu",
        "--threads",
        "1",
        "--ab",
        "",
        arm_b,
        "--rounds",
        "2",
    ]);
    let out = bench(&args);
    (tiny, out)
}

#[test]
fn ab_run_prints_a_verdict_per_test() {
    let (_tiny, out) = ab_on_cpu("ab-run", &["-p", "8", "-n", "4"], "HIPDECODE_FOO=1");
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
fn a_batched_ab_run_compares_prefill_and_decode_rates_per_batch_size() {
    let measure = ["--npl", "1,3", "--npp", "8", "--ntg", "4"];
    let (tiny, out) = ab_on_cpu("ab-batched", &measure, "--threads 2");
    let stdout = ok(&out);
    let tests: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("verdict "))
        .map(|l| l.split(": B vs A").next().unwrap_or(l))
        .collect();
    let model = tiny.path();
    let name = model.file_name().unwrap().to_str().unwrap();
    let want: Vec<String> = ["S_PP B=1", "S_TG B=1", "S_PP B=3", "S_TG B=3"]
        .iter()
        .map(|t| format!("{name} {t}"))
        .collect();
    assert_eq!(tests, want, "{stdout}");
    assert!(stdout.contains("B = --threads 2"), "{stdout}");
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

/// The batched rows of a tiny model on the CPU, as JSON objects.
fn batched_json(model: &Path, npl: &str, npp: &str, ntg: &str) -> Vec<Value> {
    let out = bench(&[
        "-m",
        model.to_str().unwrap(),
        "--device",
        "cpu",
        "--threads",
        "1",
        "--npl",
        npl,
        "--npp",
        npp,
        "--ntg",
        ntg,
        "-o",
        "json",
    ]);
    let v: Value = serde_json::from_str(&ok(&out)).expect("JSON output");
    v.as_array().expect("an array of rows").clone()
}

#[test]
fn batched_mode_prints_a_row_per_batch_size_in_every_format() {
    let tiny = TinyModel::new("batched");
    let model = tiny.path();
    let rows = batched_json(model, "1,3,4", "12", "5");
    assert_eq!(rows.len(), 3);
    for (row, b) in rows.iter().zip([1u64, 3, 4]) {
        assert_eq!(row["b"], b, "{row}");
        assert_eq!(
            (row["pp"].as_u64(), row["tg"].as_u64()),
            (Some(12), Some(5))
        );
        assert_eq!(row["n_kv"].as_u64(), Some(b * (12 + 5)), "{row}");
        for key in ["t_pp", "s_pp", "t_tg", "s_tg", "t", "s"] {
            assert!(positive_finite(&row[key]), "{key} in {row}");
        }
        // The rates are the times' (llama-batched-bench's definitions).
        let f = |k: &str| row[k].as_f64().unwrap();
        assert!((f("s_tg") - (b * 5) as f64 / f("t_tg")).abs() <= 1e-9 * f("s_tg"));
        assert!((f("s_pp") - (b * 12) as f64 / f("t_pp")).abs() <= 1e-9 * f("s_pp"));
        assert!((f("t") - f("t_pp") - f("t_tg")).abs() <= 1e-9 * f("t"));
        assert!(row["peak_device_bytes"].is_null(), "no device on the CPU");
    }
    // The tiny Llama has no sliding-window layers: B sequences take B times one's KV cache.
    let kv = |i: usize| rows[i]["kv_bytes"].as_u64().unwrap();
    assert!(kv(0) > 0);
    assert_eq!((kv(1), kv(2)), (3 * kv(0), 4 * kv(0)));

    let m = model.to_str().unwrap();
    let base = [
        "-m",
        m,
        "--device",
        "cpu",
        "--threads",
        "1",
        "--npl",
        "1,2",
        "--npp",
        "6",
        "--ntg",
        "3",
        "-o",
    ];
    let md = ok(&bench(&[&base[..], &["md"]].concat()));
    let header = md.lines().next().expect("a header line");
    for col in [
        "PP",
        "TG",
        "B",
        "N_KV",
        "T_PP s",
        "S_PP t/s",
        "T_TG s",
        "S_TG t/s",
        "T s",
        "S t/s",
        "KV bytes",
        "peak device",
    ] {
        assert!(header.contains(&format!(" {col} |")), "{col} in {header}");
    }
    let cells = |line: &str| -> Vec<String> {
        line.trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    };
    let data: Vec<Vec<String>> = md.lines().skip(2).take(2).map(cells).collect();
    for (row, b) in data.iter().zip(["1", "2"]) {
        // model, backend, PP, TG, B, N_KV, ..., peak device.
        assert_eq!(
            &row[2..6],
            &["6", "3", b, if b == "1" { "9" } else { "18" }]
        );
        for rate in [7, 9, 11] {
            let v: f64 = row[rate].parse().expect("a rate");
            assert!(v.is_finite() && v > 0.0, "{row:?}");
        }
        assert_eq!(row[13], "n/a", "{row:?}");
    }

    let csv = ok(&bench(&[&base[..], &["csv"]].concat()));
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3, "{csv}");
    let head: Vec<&str> = lines[0].split(',').collect();
    let col = |name: &str| head.iter().position(|h| *h == name).expect(name);
    for (line, b) in lines[1..].iter().zip(["1", "2"]) {
        // The backend's description holds a comma and is quoted; split after it.
        let tail = line.rsplit_once('"').expect("a quoted backend").1;
        let fields: Vec<&str> = tail.trim_start_matches(',').split(',').collect();
        let at = |name: &str| fields[col(name) - col("pp")];
        assert_eq!((at("pp"), at("tg"), at("b")), ("6", "3", b), "{line}");
        assert_eq!(at("n_kv"), if b == "1" { "9" } else { "18" }, "{line}");
        for rate in ["s_pp", "s_tg", "s"] {
            let v: f64 = at(rate).parse().expect("a rate");
            assert!(v.is_finite() && v > 0.0, "{rate} in {line}");
        }
        assert_eq!(at("peak_device_bytes"), "", "{line}");
    }
}

#[test]
fn a_batch_size_that_fails_keeps_the_rows_before_it() {
    // A million million sequences cannot be allocated: that row fails with the allocator's
    // reason, the B = 2 row before it is printed, and the one after it is not run.
    let tiny = TinyModel::new("batched-fail");
    let m = tiny.path().to_str().unwrap();
    let huge = "1000000000000";
    let args = [
        "-m",
        m,
        "--device",
        "cpu",
        "--threads",
        "1",
        "--npl",
        &format!("2,{huge},1"),
        "--npp",
        "6",
        "--ntg",
        "3",
        "-o",
        "json",
    ];
    let out = bench(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the huge batch ran: {stderr}");
    assert!(
        stderr.contains(&format!("B = {huge}")) && !stderr.contains("panicked"),
        "{stderr}"
    );
    let rows: Value = serde_json::from_slice(&out.stdout).expect("JSON rows on stdout");
    let rows = rows.as_array().expect("rows");
    assert_eq!(rows.len(), 1, "only the row before the failure: {rows:?}");
    assert_eq!(rows[0]["b"], 2);
}

#[test]
fn batched_mode_refuses_bad_flags_clearly() {
    let tiny = TinyModel::new("batched-flags");
    let m = tiny.path().to_str().unwrap();
    for (args, expected) in [
        (
            vec!["-m", m, "--npl", "0"],
            "a batch size B of --npl must be at least 1, got 0",
        ),
        (vec!["-m", m, "--npl", "x"], "'x' is not a whole number"),
        (vec!["-m", m, "--npl", "1,,2"], "is not a whole number"),
        (vec!["-m", m, "--npl", "1", "--ntg", "0"], "--ntg"),
        (vec!["-m", m, "--npp", "8"], "--npl"),
        (
            vec!["-m", m, "--npl", "2", "-p", "8"],
            "cannot be used with",
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
fn batched_mode_on_the_gpu_runs_every_batch_size() {
    let test = "batched_mode_on_the_gpu_runs_every_batch_size";
    let _lock = test_support::gpu::gpu_lock();
    if hip_ffi::testing::device_or_skip(test).is_none() {
        return;
    }
    let tiny = TinyModel::new("batched-gpu");
    let m = tiny.path().to_str().unwrap();
    let args = [
        "-m", m, "--device", "gpu", "--npl", "1,3", "--npp", "8", "--ntg", "4", "-o", "json",
    ];
    let v: Value = serde_json::from_str(&ok(&bench(&args))).expect("JSON output");
    for (row, b) in v.as_array().expect("rows").iter().zip([1u64, 3]) {
        assert_eq!(
            (row["b"].as_u64(), row["n_kv"].as_u64()),
            (Some(b), Some(12 * b))
        );
        assert!(positive_finite(&row["s_tg"]) && positive_finite(&row["peak_device_bytes"]));
    }
}

#[test]
fn a_failed_run_prints_its_message_and_causes_without_a_backtrace() {
    let missing = std::env::temp_dir().join(format!("no-such-model-{}.gguf", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_bench-decode"))
        .env("RUST_BACKTRACE", "1")
        .arg("-m")
        .arg(&missing)
        .args(["--device", "cpu", "-p", "4", "-n", "2"])
        .output()
        .expect("bench-decode runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains("no-such-model"), "{stderr}");
    assert!(!stderr.to_lowercase().contains("backtrace"), "{stderr}");
}

/// Lists for -p, -n and -d run every test at every depth, as llama-bench does: each row names
/// its depth, and the context holds the largest depth, prompt and generation together.
#[test]
fn lists_and_depths_run_every_test_at_every_depth() {
    let model = TinyModel::new("depth");
    let m = model.path().to_str().unwrap();
    let out = bench(&[
        "-m", m, "-p", "8,4", "-n", "3", "-d", "0,16", "-r", "1", "--warmup", "0", "--device",
        "cpu", "-o", "json",
    ]);
    let rows: Value = serde_json::from_str(&ok(&out)).expect("json");
    let rows = rows.as_array().expect("one object per test");
    let names: Vec<(&str, u64)> = rows
        .iter()
        .map(|r| (r["test"].as_str().unwrap(), r["n_depth"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        names,
        vec![
            ("pp8", 0),
            ("pp4", 0),
            ("pp8 @ d16", 16),
            ("pp4 @ d16", 16),
            ("tg3", 0),
            ("tg3 @ d16", 16),
        ]
    );
    assert!(
        rows.iter().all(|r| positive_finite(&r["ts_mean"])),
        "{rows:?}"
    );
    let out = bench(&[
        "-m", m, "-n", "3", "-d", "64", "--ctx", "40", "--device", "cpu",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("-d 64"),
        "{stderr}"
    );
}

/// An output file in a folder that does not exist, or a folder given as the file, fails before
/// anything is measured (before, `--svg missing/dir/x.svg` failed after the whole benchmark).
#[test]
fn output_paths_are_checked_before_the_run() {
    let model = TinyModel::new("outputs");
    let m = model.path().to_str().unwrap();
    let missing = model.dir.join("no-such-folder/x.svg");
    let out = bench(&[
        "-m",
        m,
        "--device",
        "cpu",
        "--svg",
        missing.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--svg") && stderr.contains("does not exist"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "it measured first");
    let folder = model.dir.to_str().unwrap();
    let out = bench(&["-m", m, "--device", "cpu", "--alloc-trace", folder]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--alloc-trace") && stderr.contains("is a folder"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "it measured first");
}

/// The JSON type of a value as llama-bench writes it: its integers have no fraction, its
/// floats always do (printf's `%f`), so a whole-number float would read as an integer; a
/// float field is therefore any number.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
        Value::Number(_) => "float",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `llama-bench -o json` from llama.cpp d32676d, captured on the device on 2026-12-06
/// (`scripts/h200/kv-q8-core.sh`): bench-decode's JSON must carry each of its keys, with the
/// same type, in the same unit (ns per repetition, tokens per second), so that scripts made
/// for llama-bench read it.
#[test]
fn json_carries_every_llama_bench_key_with_its_type_and_unit() {
    let captured: Value =
        serde_json::from_str(include_str!("data/llama-bench-h100-2026-12-06.json"))
            .expect("the captured llama-bench output is JSON");
    let reference = &captured[0];
    let reference_keys = reference.as_object().expect("a test object");
    assert!(reference_keys.len() >= 40, "{reference}");

    let tiny = TinyModel::new("llama-bench-keys");
    let model = tiny.path();
    let v = small_cpu_json(model, &["-d", "0,3"]);
    let tests = v.as_array().expect("an array of tests");
    assert_eq!(tests.len(), 4, "{v}");
    for t in tests {
        for (key, value) in reference_keys {
            let ours = t.get(key).unwrap_or_else(|| panic!("no {key:?} in {t}"));
            let (want, got) = (json_kind(value), json_kind(ours));
            let numbers = ["integer", "float"];
            let same = want == got || (want == "float" && numbers.contains(&got));
            assert!(
                same,
                "{key}: llama-bench writes {want} ({value}), we write {got} ({ours})"
            );
        }
        // The units: a repetition's nanoseconds and its tokens per second are one figure.
        let tokens = t["n_prompt"].as_u64().unwrap() + t["n_gen"].as_u64().unwrap();
        let ns = t["samples_ns"].as_array().unwrap();
        let ts = t["samples_ts"].as_array().unwrap();
        assert_eq!((ns.len(), ts.len()), (2, 2), "{t}");
        for (n, s) in ns.iter().zip(ts) {
            let from_ns = tokens as f64 * 1e9 / n.as_u64().unwrap() as f64;
            let s = s.as_f64().unwrap();
            assert!(
                (from_ns / s - 1.0).abs() < 1e-6,
                "{n} ns against {s} t/s: {t}"
            );
        }
        assert_eq!(t["samples_ts"], t["ts"], "{t}");
        let avg_ts = t["avg_ts"].as_f64().unwrap();
        assert!(
            (avg_ts - t["ts_mean"].as_f64().unwrap()).abs() < 1e-9,
            "{t}"
        );
        assert_eq!(t["backends"], "CPU", "{t}");
        assert_eq!(
            (t["type_k"].as_str(), t["n_gpu_layers"].as_u64()),
            (Some("f32"), Some(0))
        );
        assert_eq!(t["n_threads"], 1, "{t}");
        let time = t["test_time"].as_str().unwrap();
        assert!(
            time.len() == 20 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
            "{time}"
        );
    }
    let depths: Vec<u64> = tests
        .iter()
        .map(|t| t["n_depth"].as_u64().unwrap())
        .collect();
    assert_eq!(depths, [0, 3, 0, 3]);
}
