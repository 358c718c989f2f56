//! `--sweep`: every memory knob against the defaults, per model, in fresh child processes as
//! `--ab` runs them. Each round runs every arm once, in list order on even rounds and in
//! reverse on odd ones (ABC, CBA, ...), so slow drift falls on every arm alike. Each arm is
//! compared with the reference arm (the defaults) by the noise rule of [`crate::verdict`],
//! and its peak reserved bytes are the largest any of its runs reported.
//!
//! The arms are data ([`ARMS`]): an arm is a knob, a value and the `--ab`-style spec that sets
//! it. Knobs the runtime does not have are listed in [`NOT_MEASURED`] with the reason, and the
//! report prints them instead of pretending to measure them.

use crate::arms::{parse_arm, Arm};
use crate::cli::Args;
use crate::stats::{summarize, Summary};
use crate::table::{markdown, Column};
use crate::verdict::{compare_samples, Comparison};
use anyhow::{anyhow, bail, Context, Result};
use decode::memory::human_bytes;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// One setting of one knob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SweepArm {
    /// The knob's short name, as `--sweep-knobs` takes it.
    pub knob: &'static str,
    /// The value as the report shows it.
    pub value: &'static str,
    /// Environment assignments and flags, as an `--ab` arm.
    pub spec: &'static str,
    /// For cache-limit arms, the bound in bytes (`None`: unbounded).
    pub cache_bound: Option<u64>,
}

const MIB: u64 = 1 << 20;

const fn arm(knob: &'static str, value: &'static str, spec: &'static str) -> SweepArm {
    SweepArm {
        knob,
        value,
        spec,
        cache_bound: None,
    }
}

const fn cache(value: &'static str, spec: &'static str, bound: u64) -> SweepArm {
    SweepArm {
        knob: "cache",
        value,
        spec,
        cache_bound: Some(bound),
    }
}

/// The reference arm's knob name.
pub const REFERENCE: &str = "reference";

/// Every arm, the reference first. The cache bounds run from a few segments to well above
/// what a decode step's buffers take, so the smallest bound that costs no speed lies inside.
pub const ARMS: [SweepArm; 11] = [
    arm(REFERENCE, "defaults", ""),
    arm("cache", "unbounded", "HIPDECODE_CACHE_LIMIT=none"),
    cache("4 MiB", "HIPDECODE_CACHE_LIMIT=4MiB", 4 * MIB),
    cache("64 MiB", "HIPDECODE_CACHE_LIMIT=64MiB", 64 * MIB),
    cache("512 MiB", "HIPDECODE_CACHE_LIMIT=512MiB", 512 * MIB),
    arm("memory", "unbounded", "HIPDECODE_MEMORY_LIMIT=none"),
    arm("memory", "50%", "HIPDECODE_MEMORY_LIMIT=50%"),
    arm("graph-pool", "shared", "HIPDECODE_GRAPH_POOL=shared"),
    arm("capture-stream", "side", "HIPDECODE_CAPTURE_STREAM=side"),
    arm("trim-window", "0", "HIPDECODE_TRIM_WINDOW=0"),
    arm("trim-window", "65536", "HIPDECODE_TRIM_WINDOW=65536"),
];

/// Knobs of the issue that the runtime does not have, and why, printed with every sweep.
pub const NOT_MEASURED: [(&str, &str); 2] = [
    (
        "arena",
        "the GPU backend uses no decode arena: it reserves every buffer a step uses when the \
         model loads, so there is no arena to turn on or off",
    ),
    (
        "async allocation",
        "rocm-alloc has no stream-ordered (hipMallocAsync) path; every segment is a plain \
         device allocation",
    ),
];

/// The knob names `--sweep-knobs` accepts.
pub fn knob_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = Vec::new();
    for a in ARMS.iter().filter(|a| a.knob != REFERENCE) {
        if !names.contains(&a.knob) {
            names.push(a.knob);
        }
    }
    names
}

/// The arms to run: the reference, then every arm of the chosen knobs (all when `knobs` is
/// empty). An unknown knob is an error naming the known ones.
pub fn select(knobs: &[String]) -> Result<Vec<SweepArm>> {
    let known = knob_names();
    for k in knobs {
        if !known.contains(&k.as_str()) {
            bail!(
                "--sweep-knobs: unknown knob '{k}'; the knobs are {}",
                known.join(", ")
            );
        }
    }
    Ok(ARMS
        .iter()
        .filter(|a| a.knob == REFERENCE || knobs.is_empty() || knobs.iter().any(|k| k == a.knob))
        .copied()
        .collect())
}

/// Arm indices in run order for `rounds` rounds of `n` arms: forward, backward, forward...
pub fn schedule(n: usize, rounds: usize) -> Vec<usize> {
    (0..rounds)
        .flat_map(|r| {
            let order: Vec<usize> = if r % 2 == 0 {
                (0..n).collect()
            } else {
                (0..n).rev().collect()
            };
            order
        })
        .collect()
}

/// What one child run reported: the t/s of the test the sweep reports and the largest peak
/// reserved of any phase.
#[derive(Clone, Debug, PartialEq)]
pub struct RunFigures {
    pub test: String,
    pub ts: f64,
    pub peak_reserved: Option<u64>,
}

/// Reads a child's `-o json -r 1` output. The tg test is the one reported (decode speed), or
/// the first test when there is none.
pub fn parse_run(stdout: &str) -> Result<RunFigures> {
    let v: Value = serde_json::from_str(stdout.trim()).context("the child's output is not JSON")?;
    let tests = v
        .as_array()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| anyhow!("the child's output is not a non-empty JSON array"))?;
    let chosen = tests
        .iter()
        .find(|t| t["test"].as_str().is_some_and(|n| n.starts_with("tg")))
        .unwrap_or(&tests[0]);
    let test = chosen["test"]
        .as_str()
        .ok_or_else(|| anyhow!("a test object of the child has no 'test'"))?
        .to_string();
    let ts = chosen["ts_median"]
        .as_f64()
        .ok_or_else(|| anyhow!("a test object of the child has no number 'ts_median'"))?;
    let peak_reserved = tests
        .iter()
        .flat_map(|t| [&t["memory"], &t["load_memory"]])
        .filter_map(|m| m["device"]["peak_reserved"].as_u64())
        .max();
    Ok(RunFigures {
        test,
        ts,
        peak_reserved,
    })
}

/// One arm's runs on one model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArmResult {
    pub samples: Vec<f64>,
    pub peak_reserved: Option<u64>,
    pub test: String,
    /// Why the arm stopped, when a run failed.
    pub error: Option<String>,
}

/// One row of the report.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepRow {
    pub arm: SweepArm,
    pub result: ArmResult,
    pub summary: Option<Summary>,
    /// Against the reference arm (none for the reference itself or a failed arm).
    pub comparison: Option<Comparison>,
}

/// Summarizes every arm and compares it with the reference (the first arm).
pub fn rows(arms: &[SweepArm], results: &[ArmResult]) -> Vec<SweepRow> {
    let reference = results.first().map(|r| r.samples.as_slice()).unwrap_or(&[]);
    arms.iter()
        .zip(results)
        .enumerate()
        .map(|(i, (arm, result))| {
            let summary = summarize(&result.samples).ok();
            let comparison = (i > 0)
                .then(|| compare_samples(reference, &result.samples).ok())
                .flatten();
            SweepRow {
                arm: *arm,
                result: result.clone(),
                summary,
                comparison,
            }
        })
        .collect()
}

/// The largest share by which a bounded cache may be slower than the unbounded one and still
/// count as costing nothing.
pub const CACHE_TOLERANCE_PCT: f64 = 2.0;

/// The smallest cache bound whose median t/s is within [`CACHE_TOLERANCE_PCT`] of the
/// unbounded arm's, with its delta; `None` when no bound qualifies or an arm is missing.
pub fn smallest_cache_within_tolerance(rows: &[SweepRow]) -> Option<(u64, f64)> {
    let unbounded = rows
        .iter()
        .find(|r| r.arm.knob == "cache" && r.arm.cache_bound.is_none())?;
    let mut bounded: Vec<&SweepRow> = rows
        .iter()
        .filter(|r| r.arm.cache_bound.is_some() && !r.result.samples.is_empty())
        .collect();
    bounded.sort_by_key(|r| r.arm.cache_bound);
    bounded.into_iter().find_map(|r| {
        let c = compare_samples(&unbounded.result.samples, &r.result.samples).ok()?;
        (c.delta_pct >= -CACHE_TOLERANCE_PCT).then_some((r.arm.cache_bound?, c.delta_pct))
    })
}

/// The report of one model: the table, the cache choice, the knobs not measured.
pub fn markdown_report(model: &str, rounds: usize, rows: &[SweepRow]) -> String {
    let test = rows
        .iter()
        .map(|r| r.result.test.as_str())
        .find(|t| !t.is_empty())
        .unwrap_or("t/s");
    let mut out = format!(
        "sweep {model}: {rounds} rounds, arms forward then backward, a fresh process per run\n\n"
    );
    let columns = [
        Column::left("knob"),
        Column::left("value"),
        Column::left("setting"),
        Column::right("peak reserved"),
        Column::right(format!("{test} median t/s")),
        Column::right("min–max"),
        Column::right("rel MAD"),
        Column::right("Δ vs reference"),
        Column::left("verdict"),
    ];
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let (median, range, mad) = match &r.summary {
                Some(s) => (
                    format!("{:.2}", s.median),
                    format!("{:.2}–{:.2}", s.min, s.max),
                    format!("{:.2} %", 100.0 * s.rel_mad()),
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            let (delta, verdict) = match (&r.comparison, &r.result.error) {
                (_, Some(e)) => ("-".into(), format!("failed: {e}")),
                (Some(c), None) => (
                    format!("{:+.2} % (±{:.2})", c.delta_pct, c.noise_pct),
                    c.verdict.to_string(),
                ),
                (None, None) => (String::new(), String::new()),
            };
            vec![
                r.arm.knob.to_string(),
                r.arm.value.to_string(),
                if r.arm.spec.is_empty() {
                    "(defaults)".to_string()
                } else {
                    r.arm.spec.to_string()
                },
                r.result
                    .peak_reserved
                    .map(human_bytes)
                    .unwrap_or_else(|| "-".into()),
                median,
                range,
                mad,
                delta,
                verdict,
            ]
        })
        .collect();
    out.push_str(&markdown(&columns, &body));
    out.push('\n');
    if rows.iter().any(|r| r.arm.knob == "cache") {
        match smallest_cache_within_tolerance(rows) {
            Some((bound, delta)) => out.push_str(&format!(
                "cache limit {model}: the smallest bound within {CACHE_TOLERANCE_PCT} % of \
                 unbounded is {} ({delta:+.2} % against unbounded)\n",
                human_bytes(bound)
            )),
            None => out.push_str(&format!(
                "cache limit {model}: no bound measured is within {CACHE_TOLERANCE_PCT} % of \
                 unbounded (or an arm failed)\n"
            )),
        }
    }
    for (knob, why) in NOT_MEASURED {
        out.push_str(&format!("not measured: {knob}: {why}\n"));
    }
    out
}

/// The last lines of a child's stderr, for an error message.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}

/// Runs one child for `arm` on `model`.
fn run_child(exe: &PathBuf, args: &Args, model: &PathBuf, arm: &Arm) -> Result<RunFigures> {
    let out = Command::new(exe)
        .args(args.child_args_for(std::slice::from_ref(model)))
        .args(&arm.args)
        .envs(arm.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {}", exe.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("{}: {}", out.status, tail(&stderr, 3));
    }
    parse_run(&String::from_utf8_lossy(&out.stdout))
        .with_context(|| format!("its stderr ends: {}", tail(&stderr, 3)))
}

/// Runs the sweep on every model and returns the Markdown report. A failing arm is reported
/// in its row and not run again; the others go on.
pub fn run(args: &Args) -> Result<String> {
    let arms = select(&args.sweep_knobs)?;
    let parsed: Vec<Arm> = arms
        .iter()
        .map(|a| parse_arm(a.spec))
        .collect::<Result<_, _>>()?;
    let exe = std::env::current_exe().context("finding this executable to run the arms")?;
    let mut out = String::new();
    for model in &args.models {
        let name = model.file_name().map_or_else(
            || model.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let mut results = vec![ArmResult::default(); arms.len()];
        let order = schedule(arms.len(), args.rounds);
        for (i, &a) in order.iter().enumerate() {
            if results[a].error.is_some() {
                continue;
            }
            let round = i / arms.len() + 1;
            eprintln!(
                "{name} round {round}/{}: {} = {}",
                args.rounds, arms[a].knob, arms[a].value
            );
            match run_child(&exe, args, model, &parsed[a]) {
                Ok(f) => {
                    let r = &mut results[a];
                    r.samples.push(f.ts);
                    r.test = f.test;
                    r.peak_reserved = r.peak_reserved.max(f.peak_reserved);
                }
                Err(e) => {
                    eprintln!("  failed: {e:#}");
                    results[a].error = Some(format!("{e:#}"));
                }
            }
        }
        out.push_str(&markdown_report(&name, args.rounds, &rows(&arms, &results)));
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Verdict;
    use serde_json::json;

    #[test]
    fn every_arm_parses_and_the_reference_comes_first() {
        assert_eq!(ARMS[0].knob, REFERENCE);
        assert!(ARMS[0].spec.is_empty());
        for a in ARMS {
            parse_arm(a.spec).unwrap_or_else(|e| panic!("{}: {e}", a.value));
        }
        // Every variable an arm sets is a knob that takes the value (a typo would measure
        // nothing, a bad value would fail every run of the arm).
        for a in ARMS {
            let env = parse_arm(a.spec).unwrap().env;
            let env = knobs::Env::from_pairs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            let warnings = decode::environment::check_env(&env).expect("the arm's values");
            assert!(warnings.is_empty(), "{}: {warnings:?}", a.spec);
        }
    }

    #[test]
    fn knobs_select_their_arms_and_an_unknown_one_is_refused() {
        let all = select(&[]).unwrap();
        assert_eq!(all.len(), ARMS.len());
        let some = select(&["graph-pool".into()]).unwrap();
        assert_eq!(
            some.iter().map(|a| a.knob).collect::<Vec<_>>(),
            [REFERENCE, "graph-pool"]
        );
        let e = select(&["arena".into()]).unwrap_err().to_string();
        assert!(e.contains("'arena'") && e.contains("cache, memory"), "{e}");
    }

    #[test]
    fn the_schedule_alternates_direction() {
        assert_eq!(schedule(3, 2), [0, 1, 2, 2, 1, 0]);
        assert!(schedule(3, 0).is_empty());
    }

    #[test]
    fn a_run_reports_tg_and_the_largest_peak_reserved() {
        let out = json!([
            {"test": "pp64", "ts_median": 900.0,
             "memory": {"device": {"peak_reserved": 300}}, "load_memory": {"device": {"peak_reserved": 500}}},
            {"test": "tg16", "ts_median": 90.0,
             "memory": {"device": {"peak_reserved": 400}}, "load_memory": {"device": {"peak_reserved": 500}}},
        ]);
        let f = parse_run(&out.to_string()).unwrap();
        assert_eq!(
            f,
            RunFigures {
                test: "tg16".into(),
                ts: 90.0,
                peak_reserved: Some(500)
            }
        );
        // On the CPU there is no device: no peak reserved, not an error.
        let cpu = json!([{"test": "pp8", "ts_median": 5.0, "memory": {"device": null}}]);
        assert_eq!(parse_run(&cpu.to_string()).unwrap().peak_reserved, None);
        assert!(parse_run("[]").is_err());
        assert!(parse_run(r#"[{"test":"tg4"}]"#).is_err());
    }

    fn result(samples: &[f64]) -> ArmResult {
        ArmResult {
            samples: samples.to_vec(),
            peak_reserved: Some(1 << 30),
            test: "tg64".into(),
            error: None,
        }
    }

    #[test]
    fn the_smallest_bound_within_two_percent_of_unbounded_is_chosen() {
        let arms = select(&["cache".into()]).unwrap();
        // reference, unbounded, 4, 64, 512 MiB: 4 MiB is 5 % slower, 64 MiB 1 % slower.
        let results = [
            result(&[100.0, 100.5, 99.5]),
            result(&[100.0, 100.2, 99.8]),
            result(&[95.0, 95.1, 94.9]),
            result(&[99.0, 99.1, 98.9]),
            result(&[100.1, 100.0, 99.9]),
        ];
        let rows = rows(&arms, &results);
        assert!(rows[0].comparison.is_none());
        assert_eq!(rows[2].comparison.unwrap().verdict, Verdict::Slower);
        let (bound, delta) = smallest_cache_within_tolerance(&rows).unwrap();
        assert_eq!(bound, 64 * MIB);
        assert!((delta + 1.0).abs() < 1e-9, "{delta}");
        let md = markdown_report("m.gguf", 3, &rows);
        assert!(
            md.contains("smallest bound within 2 % of unbounded is 64.0 MiB"),
            "{md}"
        );
        assert!(
            md.contains("not measured: arena") && md.contains("1.0 GiB"),
            "{md}"
        );
        assert!(md.contains("tg64 median t/s"), "{md}");
    }

    #[test]
    fn a_failed_arm_shows_its_error_and_blocks_no_choice_silently() {
        let arms = select(&["cache".into()]).unwrap();
        let mut results: Vec<ArmResult> =
            (0..arms.len()).map(|_| result(&[100.0, 100.0])).collect();
        results[1] = ArmResult {
            error: Some("exit status: 1: out of memory".into()),
            ..ArmResult::default()
        };
        let rows = rows(&arms, &results);
        assert!(smallest_cache_within_tolerance(&rows).is_none());
        let md = markdown_report("m.gguf", 2, &rows);
        assert!(md.contains("failed: exit status: 1: out of memory"), "{md}");
        assert!(md.contains("no bound measured is within 2 %"), "{md}");
    }
}
