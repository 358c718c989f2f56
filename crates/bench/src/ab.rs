//! `--ab ARM_A ARM_B`: the two arms run alternately, each run a fresh child process of this
//! executable with the arm's environment and flags, so settings read from the environment at
//! start-up take effect per run. Each child measures one repetition of every test and prints
//! JSON; the parent collects one t/s per arm, test and round and applies the noise rule of
//! [`crate::verdict`].
//!
//! The order is ABBA: round 0 runs A then B, round 1 B then A, and so on (A B B A A B B A...).
//! Slow drift (clocks settling, the machine warming up, other load fading) then hits both
//! arms alike: over every two rounds each arm has run once first and once second, so a linear
//! trend adds the same to both, where ABAB would always hand B the later slot.

use crate::arms::{parse_arm, Arm};
use crate::cli::Args;
use crate::stats::{summarize, Summary};
use crate::table::{csv_line, markdown, Column};
use crate::verdict::{compare, Comparison};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::process::{Command, Stdio};

/// The arm names, in the order the arguments gave them.
pub const NAMES: [&str; 2] = ["A", "B"];

/// The arms (0 = A, 1 = B) in run order for `rounds` rounds: A B, B A, A B, ...
pub fn schedule(rounds: usize) -> Vec<usize> {
    (0..rounds)
        .flat_map(|r| if r % 2 == 0 { [0, 1] } else { [1, 0] })
        .collect()
}

/// One measured figure of a child run.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildSample {
    pub model: String,
    pub model_path: String,
    pub test: String,
    pub ts: f64,
}

/// Reads a child's `-o json -r 1` output: every test's t/s (the median, which for one
/// repetition is that repetition). A batched child (`--npl`) gives one row per batch size
/// instead; each row becomes two tests, its prefill and its decode rate summed over the
/// sequences (`S_PP` and `S_TG`, as llama-batched-bench names them).
pub fn parse_child_output(stdout: &str) -> Result<Vec<ChildSample>> {
    let v: Value = serde_json::from_str(stdout.trim()).context("the child's output is not JSON")?;
    let tests = v
        .as_array()
        .ok_or_else(|| anyhow!("the child's output is not a JSON array"))?;
    let text = |t: &Value, key: &str| {
        t[key]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("a test object of the child has no string '{key}'"))
    };
    let number = |t: &Value, key: &str| {
        t[key]
            .as_f64()
            .ok_or_else(|| anyhow!("a test object of the child has no number '{key}'"))
    };
    let mut samples = Vec::new();
    for t in tests {
        let (model, model_path) = (text(t, "model")?, text(t, "model_path")?);
        if t.get("s_tg").is_some() {
            let b = t["b"]
                .as_u64()
                .ok_or_else(|| anyhow!("a batched row of the child has no batch size 'b'"))?;
            for (rate, key) in [("S_PP", "s_pp"), ("S_TG", "s_tg")] {
                samples.push(ChildSample {
                    model: model.clone(),
                    model_path: model_path.clone(),
                    test: format!("{rate} B={b}"),
                    ts: number(t, key)?,
                });
            }
        } else {
            samples.push(ChildSample {
                model,
                model_path,
                test: text(t, "test")?,
                ts: number(t, "ts_median")?,
            });
        }
    }
    if samples.is_empty() {
        bail!("the child measured no test");
    }
    Ok(samples)
}

/// What a figure is of: model name, model path (two files may share a name), test.
pub type TestKey = (String, String, String);

/// Every figure of both arms, by model and test, in first-seen order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Collected {
    /// Each test and each arm's figures in run order.
    pub entries: Vec<(TestKey, [Vec<f64>; 2])>,
}

impl Collected {
    pub fn add(&mut self, arm: usize, samples: &[ChildSample]) {
        for s in samples {
            let key = (s.model.clone(), s.model_path.clone(), s.test.clone());
            let i = match self.entries.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    self.entries.push((key, [Vec::new(), Vec::new()]));
                    self.entries.len() - 1
                }
            };
            self.entries[i].1[arm].push(s.ts);
        }
    }
}

/// One model and test, both arms summarized and compared.
#[derive(Clone, Debug, PartialEq)]
pub struct AbRow {
    pub model: String,
    pub test: String,
    pub samples: [Vec<f64>; 2],
    pub summaries: [Summary; 2],
    pub comparison: Comparison,
}

/// Summarizes and compares every entry; a test that only one arm ran is an error (an arm
/// that changes `-p` or `-n` measures a different test).
pub fn rows(c: &Collected) -> Result<Vec<AbRow>> {
    c.entries
        .iter()
        .map(|((model, _, test), samples)| {
            for (arm, s) in samples.iter().enumerate() {
                if s.is_empty() {
                    bail!(
                        "{model} {test}: only arm {} ran it, so there is nothing to compare",
                        NAMES[1 - arm]
                    );
                }
            }
            let sum = |arm: usize| {
                summarize(&samples[arm])
                    .with_context(|| format!("{model} {test}, arm {}", NAMES[arm]))
            };
            let summaries = [sum(0)?, sum(1)?];
            let comparison =
                compare(&summaries[0], &summaries[1]).with_context(|| format!("{model} {test}"))?;
            Ok(AbRow {
                model: model.clone(),
                test: test.clone(),
                samples: samples.clone(),
                summaries,
                comparison,
            })
        })
        .collect()
}

/// The one-line verdict of a row.
pub fn verdict_line(r: &AbRow) -> String {
    format!(
        "verdict {} {}: B vs A {:+.2} % (noise band ±{:.2} %): {}",
        r.model, r.test, r.comparison.delta_pct, r.comparison.noise_pct, r.comparison.verdict
    )
}

fn range(s: &Summary) -> String {
    format!("{:.2}–{:.2}", s.min, s.max)
}

/// The Markdown report: the arms, a table of both arms per test, a verdict line per test.
pub fn markdown_report(arms: &[Arm; 2], rounds: usize, rows: &[AbRow]) -> String {
    let mut out = format!(
        "A/B over {rounds} rounds, order ABBA (A B, B A, ...), a fresh process per run\n\
         A = {}\nB = {}\n\n",
        arms[0].label(),
        arms[1].label()
    );
    let columns = [
        Column::left("model"),
        Column::right("test"),
        Column::left("arm"),
        Column::right("median t/s"),
        Column::right("min–max"),
        Column::right("rel MAD"),
        Column::right("Δ vs A"),
        Column::left("verdict"),
    ];
    let mut body = Vec::new();
    for r in rows {
        for (arm, name) in NAMES.iter().enumerate() {
            let s = &r.summaries[arm];
            let (delta, verdict) = if arm == 1 {
                (
                    format!("{:+.2} %", r.comparison.delta_pct),
                    r.comparison.verdict.to_string(),
                )
            } else {
                (String::new(), String::new())
            };
            body.push(vec![
                r.model.clone(),
                r.test.clone(),
                name.to_string(),
                format!("{:.2}", s.median),
                range(s),
                format!("{:.2} %", 100.0 * s.rel_mad()),
                delta,
                verdict,
            ]);
        }
    }
    out.push_str(&markdown(&columns, &body));
    out.push('\n');
    for r in rows {
        out.push_str(&verdict_line(r));
        out.push('\n');
    }
    out
}

fn arm_json(arm: &Arm) -> Value {
    json!({
        "spec": arm.spec,
        "env": arm.env.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
        "args": arm.args,
    })
}

fn summary_json(samples: &[f64], s: &Summary) -> Value {
    json!({
        "ts": samples,
        "median": s.median,
        "mean": s.mean,
        "sd": s.sd,
        "min": s.min,
        "max": s.max,
        "mad": s.mad,
        "rel_mad": s.rel_mad(),
    })
}

pub fn json_report(arms: &[Arm; 2], rounds: usize, rows: &[AbRow]) -> Value {
    json!({
        "order": "ABBA",
        "rounds": rounds,
        "a": arm_json(&arms[0]),
        "b": arm_json(&arms[1]),
        "comparisons": rows.iter().map(|r| json!({
            "model": r.model,
            "test": r.test,
            "a": summary_json(&r.samples[0], &r.summaries[0]),
            "b": summary_json(&r.samples[1], &r.summaries[1]),
            "delta_pct": r.comparison.delta_pct,
            "noise_pct": r.comparison.noise_pct,
            "verdict": r.comparison.verdict.as_str(),
        })).collect::<Vec<_>>(),
    })
}

pub fn csv_report(rows: &[AbRow]) -> String {
    let mut out = csv_line(&[
        "model",
        "test",
        "a_median",
        "a_min",
        "a_max",
        "a_rel_mad",
        "b_median",
        "b_min",
        "b_max",
        "b_rel_mad",
        "delta_pct",
        "noise_pct",
        "verdict",
    ]);
    for r in rows {
        let [a, b] = &r.summaries;
        out.push_str(&csv_line(&[
            r.model.clone(),
            r.test.clone(),
            a.median.to_string(),
            a.min.to_string(),
            a.max.to_string(),
            a.rel_mad().to_string(),
            b.median.to_string(),
            b.min.to_string(),
            b.max.to_string(),
            b.rel_mad().to_string(),
            r.comparison.delta_pct.to_string(),
            r.comparison.noise_pct.to_string(),
            r.comparison.verdict.as_str().to_string(),
        ]));
    }
    out
}

/// The last lines of a child's stderr, for an error message.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Parses both arms (before anything runs, so a typo costs nothing).
pub fn parse_arms(specs: &[String]) -> Result<[Arm; 2]> {
    match specs {
        [a, b] => Ok([parse_arm(a)?, parse_arm(b)?]),
        _ => bail!("--ab takes exactly two arms, got {}", specs.len()),
    }
}

/// Runs the comparison and returns the report in the requested format.
pub fn run(args: &Args) -> Result<String> {
    let specs = args.ab.as_deref().unwrap_or_default();
    let arms = parse_arms(specs)?;
    let exe = std::env::current_exe().context("finding this executable to run the arms")?;
    let base = args.child_args();
    let mut collected = Collected::default();
    let mut shown_stderr = [false; 2];
    let order = schedule(args.rounds);
    for (i, &arm) in order.iter().enumerate() {
        let round = i / 2 + 1;
        eprintln!(
            "round {round}/{}: arm {}: {}",
            args.rounds,
            NAMES[arm],
            arms[arm].label()
        );
        let out = Command::new(&exe)
            .args(&base)
            .args(&arms[arm].args)
            .envs(arms[arm].env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("starting {}", exe.display()))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            bail!(
                "arm {} ({}) failed in round {round} ({}):\n{}",
                NAMES[arm],
                arms[arm].label(),
                out.status,
                tail(&stderr, 20)
            );
        }
        // What the child says once per arm (warnings, notes) is worth seeing; the rest
        // would repeat it every round.
        if !shown_stderr[arm] {
            shown_stderr[arm] = true;
            for line in stderr.lines() {
                eprintln!("  [{}] {line}", NAMES[arm]);
            }
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let samples = parse_child_output(&stdout).with_context(|| {
            format!(
                "arm {} in round {round}; its stderr ends:\n{}",
                NAMES[arm],
                tail(&stderr, 20)
            )
        })?;
        collected.add(arm, &samples);
    }
    let rows = rows(&collected)?;
    Ok(match args.format() {
        crate::cli::Format::Md => markdown_report(&arms, args.rounds, &rows),
        crate::cli::Format::Json => format!(
            "{}\n",
            serde_json::to_string_pretty(&json_report(&arms, args.rounds, &rows))?
        ),
        crate::cli::Format::Csv => csv_report(&rows),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Verdict;

    #[test]
    fn the_schedule_is_abba() {
        assert_eq!(schedule(3), vec![0, 1, 1, 0, 0, 1]);
        assert_eq!(schedule(0), Vec::<usize>::new());
        // Over an even number of rounds both arms have the same mean position.
        let s = schedule(4);
        let mean = |arm| {
            let p: Vec<usize> = (0..s.len()).filter(|&i| s[i] == arm).collect();
            p.iter().sum::<usize>() as f64 / p.len() as f64
        };
        assert_eq!(mean(0), mean(1));
    }

    fn child(pp: f64, tg: f64) -> String {
        json!([
            {"model": "t.gguf", "model_path": "/x/t.gguf", "test": "pp8", "ts": [pp], "ts_median": pp},
            {"model": "t.gguf", "model_path": "/x/t.gguf", "test": "tg4", "ts": [tg], "ts_median": tg},
        ])
        .to_string()
    }

    #[test]
    fn child_output_is_parsed_and_collected_per_arm() {
        let mut c = Collected::default();
        for (arm, pp, tg) in [
            (0, 100.0, 10.0),
            (1, 120.0, 10.05),
            (1, 121.0, 10.0),
            (0, 101.0, 10.1),
        ] {
            c.add(arm, &parse_child_output(&child(pp, tg)).unwrap());
        }
        assert_eq!(c.entries.len(), 2);
        assert_eq!(c.entries[0].1, [vec![100.0, 101.0], vec![120.0, 121.0]]);
        let rows = rows(&c).unwrap();
        assert_eq!(rows[0].comparison.verdict, Verdict::Faster);
        assert_eq!(rows[1].comparison.verdict, Verdict::WithinNoise);
        let arms = [
            parse_arm("").unwrap(),
            parse_arm("HIPDECODE_FOO=1").unwrap(),
        ];
        let md = markdown_report(&arms, 2, &rows);
        assert!(md.contains("A = (baseline)\nB = HIPDECODE_FOO=1"), "{md}");
        assert!(md.contains("verdict t.gguf pp8: B vs A +19.90 %"), "{md}");
        assert!(
            md.contains("): faster\n") && md.contains("): within noise\n"),
            "{md}"
        );
        assert!(md.contains("100.00–101.00"), "{md}");
        let j = json_report(&arms, 2, &rows);
        assert_eq!(j["comparisons"][0]["verdict"], "faster");
        assert_eq!(j["comparisons"][0]["b"]["ts"], json!([120.0, 121.0]));
        let csv = csv_report(&rows);
        assert_eq!(csv.lines().count(), 3);
        assert!(csv.lines().nth(1).unwrap().ends_with(",faster"));
    }

    #[test]
    fn a_batched_childs_rows_become_its_prefill_and_decode_rates() {
        let row = |b: usize, s_pp: &str, s_tg: &str| {
            format!(
                r#"{{"model":"t.gguf","model_path":"/m/t.gguf","b":{b},"pp":16,"tg":4,"s_pp":{s_pp},"s_tg":{s_tg}}}"#
            )
        };
        let out = format!("[{},{}]", row(1, "50.5", "10.25"), row(8, "300", "70"));
        let samples = parse_child_output(&out).unwrap();
        let got: Vec<(&str, f64)> = samples.iter().map(|s| (s.test.as_str(), s.ts)).collect();
        assert_eq!(
            got,
            [
                ("S_PP B=1", 50.5),
                ("S_TG B=1", 10.25),
                ("S_PP B=8", 300.0),
                ("S_TG B=8", 70.0)
            ]
        );
        assert!(samples.iter().all(|s| s.model_path == "/m/t.gguf"));
        // A rate that is not a number (a failed row's null) is an error, not a 0.
        let e = parse_child_output(&format!("[{}]", row(1, "50", "null")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("s_tg"), "{e}");
        let e = parse_child_output(r#"[{"model":"m","model_path":"m","s_tg":1,"s_pp":1}]"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch size"), "{e}");
    }

    #[test]
    fn bad_child_output_and_one_sided_tests_are_errors() {
        assert!(parse_child_output("not json").is_err());
        assert!(parse_child_output("{}").is_err());
        assert!(parse_child_output("[]").is_err());
        assert!(parse_child_output(r#"[{"model":"m","model_path":"m","test":"pp8"}]"#).is_err());
        // NaN cannot even be written as JSON; a null t/s is refused, not read as 0.
        assert!(parse_child_output(
            r#"[{"model":"m","model_path":"m","test":"pp8","ts_median":null}]"#
        )
        .is_err());
        let mut c = Collected::default();
        c.add(0, &parse_child_output(&child(1.0, 1.0)).unwrap());
        let e = rows(&c).unwrap_err().to_string();
        assert!(e.contains("only arm A ran it"), "{e}");
    }

    #[test]
    fn arms_are_parsed_up_front() {
        assert!(parse_arms(&["".into(), "X=1".into()]).is_ok());
        let e = parse_arms(&["".into(), "oops".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("'oops'"), "{e}");
    }
}
