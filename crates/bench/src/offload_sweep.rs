//! The offload sweep's report: decode speed against GPU budget, per model, beside llama.cpp's
//! curve on the same machine, as a Markdown table and an SVG chart.
//!
//! `scripts/h200/offload-sweep.sh` runs `bench-decode --gpu-budget B -o json` once per budget
//! and lists the runs in a TSV file; `offload-sweep-report` reads it with [`read_points`].
//! Each run's tg speed and its peak device memory come from the bench's JSON. The peak is the
//! part the budget caps: the allocator's peak reserved bytes (over load and decode) plus the
//! device memory the process holds outside the allocator. The runtime's context, created
//! before the first reading, is not in it; the script's `nvidia-smi` peak, when present,
//! includes it.

use crate::curve::{Labels, Series};
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::fmt::Write;
use std::path::Path;

const MIB: f64 = (1u64 << 20) as f64;

/// Which llama.cpp curve a model is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dense,
    Moe,
}

/// llama.cpp on the same H200: (GPU MiB, tok/s, setting). MoE: Qwen3 30B-A3B Q4_K_M with
/// `--n-cpu-moe N`; dense: Llama 3.1 8B Q4_K_M with `-ngl G` (issue 11's figures).
pub fn llama_cpp(kind: Kind) -> &'static [(f64, f64, &'static str)] {
    match kind {
        Kind::Moe => &[
            (1589.0, 41.7, "--n-cpu-moe 48"),
            (5773.0, 54.3, "--n-cpu-moe 36"),
            (9959.0, 70.7, "--n-cpu-moe 24"),
            (14141.0, 110.0, "--n-cpu-moe 12"),
            (18231.0, 285.0, "--n-cpu-moe 0"),
        ],
        Kind::Dense => &[
            (1003.0, 14.4, "-ngl 0"),
            (1951.0, 19.5, "-ngl 8"),
            (2961.0, 27.9, "-ngl 16"),
            (3971.0, 47.5, "-ngl 24"),
            (5113.0, 265.7, "-ngl 33"),
        ],
    }
}

/// One budget's run.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub model: String,
    pub kind: Kind,
    pub budget_mib: f64,
    /// Mean tg tok/s; `None` when the run was refused or failed.
    pub tok_s: Option<f64>,
    /// Peak device MiB the budget caps (see the module documentation).
    pub peak_mib: Option<f64>,
    /// The `nvidia-smi` peak of the process, context included, when the script had it.
    pub smi_peak_mib: Option<f64>,
    /// Why there is no speed (the first error line), or empty.
    pub note: String,
}

/// Mean tg tok/s and peak budgeted device MiB of a `bench-decode -o json` output.
pub fn from_bench_json(json: &Value) -> Result<(f64, f64)> {
    let tests = json
        .as_array()
        .context("bench-decode's JSON is an array of tests")?;
    let tg = tests
        .iter()
        .find(|t| t["test"].as_str().is_some_and(|n| n.starts_with("tg")))
        .context("no tg test in the bench output (run it with -n above 0)")?;
    let tok_s = tg["ts_mean"]
        .as_f64()
        .context("the tg test has no ts_mean")?;
    let mut peak = 0u64;
    let mut outside = 0u64;
    for phase in [&tg["memory"], &tg["load_memory"]] {
        let d = &phase["device"];
        peak = peak.max(d["peak_reserved"].as_u64().unwrap_or(0));
        outside = outside.max(d["outside_allocator"].as_u64().unwrap_or(0));
    }
    if peak == 0 {
        bail!("the bench output has no device memory (was it a GPU run?)");
    }
    Ok((tok_s, (peak + outside) as f64 / MIB))
}

/// Reads the sweep's TSV: `model kind budget_mib json_or_error_file smi_peak_mib` per line
/// (`#` lines skipped; `-` for no nvidia-smi figure). A run whose file is not bench JSON is a
/// point without speed, noted with the file's first line (a refusal, say).
pub fn read_points(tsv: &Path) -> Result<Vec<Point>> {
    let text =
        std::fs::read_to_string(tsv).with_context(|| format!("reading {}", tsv.display()))?;
    let base = tsv.parent().unwrap_or(Path::new("."));
    let mut points = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        let [model, kind, budget, file, smi] = f[..] else {
            bail!(
                "{}:{}: expected 5 tab-separated fields (model kind budget_mib file smi_mib), got {}",
                tsv.display(),
                n + 1,
                f.len()
            );
        };
        let kind = match kind {
            "dense" => Kind::Dense,
            "moe" => Kind::Moe,
            other => bail!(
                "{}:{}: kind {other:?} is not dense or moe",
                tsv.display(),
                n + 1
            ),
        };
        let budget_mib: f64 = budget
            .parse()
            .with_context(|| format!("{}:{}: budget {budget:?}", tsv.display(), n + 1))?;
        let smi_peak_mib = smi.parse().ok();
        let path = base.join(file);
        let body = std::fs::read_to_string(&path).unwrap_or_default();
        let (tok_s, peak_mib, note) = match serde_json::from_str::<Value>(&body)
            .map_err(anyhow::Error::from)
            .and_then(|v| from_bench_json(&v))
        {
            Ok((t, p)) => (Some(t), Some(p), String::new()),
            Err(_) => (
                None,
                None,
                body.lines()
                    .find(|l| l.to_ascii_lowercase().starts_with("error"))
                    .or_else(|| body.lines().last())
                    .unwrap_or("no output")
                    .to_string(),
            ),
        };
        points.push(Point {
            model: model.to_string(),
            kind,
            budget_mib,
            tok_s,
            peak_mib,
            smi_peak_mib,
            note,
        });
    }
    Ok(points)
}

/// Places where a larger budget decoded slower, as text (empty when monotone).
pub fn dips(points: &[&Point]) -> Vec<String> {
    let mut measured: Vec<(f64, f64)> = points
        .iter()
        .filter_map(|p| Some((p.budget_mib, p.tok_s?)))
        .collect();
    measured.sort_by(|a, b| a.0.total_cmp(&b.0));
    measured
        .windows(2)
        .filter(|w| w[1].1 < w[0].1)
        .map(|w| {
            format!(
                "{:.0} MiB: {:.1} tok/s after {:.1} at {:.0} MiB ({:+.1}%)",
                w[1].0,
                w[1].1,
                w[0].1,
                w[0].0,
                100.0 * (w[1].1 / w[0].1 - 1.0)
            )
        })
        .collect()
}

/// The models in first-seen order.
fn models(points: &[Point]) -> Vec<(String, Kind)> {
    let mut out: Vec<(String, Kind)> = Vec::new();
    for p in points {
        if !out.iter().any(|(m, _)| *m == p.model) {
            out.push((p.model.clone(), p.kind));
        }
    }
    out
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".to_string(), |v| format!("{v:.digits$}"))
}

/// The Markdown report: per model a table by budget, the monotonicity and budget checks, and
/// llama.cpp's points.
pub fn markdown(points: &[Point]) -> String {
    let mut s = String::new();
    for (model, kind) in models(points) {
        let mut rows: Vec<&Point> = points.iter().filter(|p| p.model == model).collect();
        rows.sort_by(|a, b| a.budget_mib.total_cmp(&b.budget_mib));
        let _ = writeln!(s, "### {model}\n");
        let _ = writeln!(
            s,
            "| GPU budget MiB | tg tok/s | peak device MiB (budgeted) | within budget | nvidia-smi peak MiB (with context) | note |"
        );
        let _ = writeln!(s, "| ---: | ---: | ---: | :---: | ---: | --- |");
        for p in &rows {
            let within = match p.peak_mib {
                Some(peak) if peak <= p.budget_mib => "yes",
                Some(_) => "**no**",
                None => "–",
            };
            let _ = writeln!(
                s,
                "| {:.0} | {} | {} | {within} | {} | {} |",
                p.budget_mib,
                opt(p.tok_s, 1),
                opt(p.peak_mib, 0),
                opt(p.smi_peak_mib, 0),
                p.note.replace('|', "\\|")
            );
        }
        let d = dips(&rows);
        if d.is_empty() {
            let _ = writeln!(s, "\ntok/s rises monotonically with the budget.");
        } else {
            let _ = writeln!(
                s,
                "\n**tok/s is not monotone in the budget** at: {}.",
                d.join("; ")
            );
        }
        let over = rows
            .iter()
            .filter(|p| p.peak_mib.is_some_and(|peak| peak > p.budget_mib))
            .count();
        let _ = writeln!(
            s,
            "{}",
            if over == 0 {
                "Every measured run's peak device memory stayed within its budget.".to_string()
            } else {
                format!("**{over} runs exceeded their budget.**")
            }
        );
        let _ = writeln!(s, "\nllama.cpp on the same H200:\n");
        let _ = writeln!(s, "| setting | GPU MiB | tg tok/s |\n| --- | ---: | ---: |");
        for (mib, tps, setting) in llama_cpp(kind) {
            let _ = writeln!(s, "| `{setting}` | {mib:.0} | {tps:.1} |");
        }
        s.push('\n');
    }
    s
}

/// The chart's series: each model's measured points (x: the peak budgeted MiB where measured,
/// else the budget) and llama.cpp's curve for its kind, dashed.
pub fn series(points: &[Point]) -> Vec<Series> {
    const OURS: [&str; 2] = ["#4e79a7", "#59a14f"];
    const THEIRS: [&str; 2] = ["#e15759", "#f28e2b"];
    let mut out = Vec::new();
    for (i, (model, kind)) in models(points).into_iter().enumerate() {
        out.push(Series {
            name: format!("hipdecode {model}"),
            color: OURS[i % 2].into(),
            dashed: false,
            points: points
                .iter()
                .filter(|p| p.model == model)
                .filter_map(|p| Some((p.budget_mib, p.tok_s?)))
                .collect(),
        });
        out.push(Series {
            name: format!(
                "llama.cpp {}",
                match kind {
                    Kind::Dense => "8B -ngl",
                    Kind::Moe => "30B-A3B --n-cpu-moe",
                }
            ),
            color: THEIRS[i % 2].into(),
            dashed: true,
            points: llama_cpp(kind).iter().map(|&(m, t, _)| (m, t)).collect(),
        });
    }
    out
}

/// The chart's labels.
pub fn labels() -> Labels {
    Labels {
        title: "Decode speed under a GPU budget (H200; hipdecode x = budget, llama.cpp x = GPU MiB used)"
            .into(),
        x: "GPU MiB".into(),
        y: "tg tok/s (log scale)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn point(budget: f64, tok_s: Option<f64>, peak: Option<f64>) -> Point {
        Point {
            model: "m".into(),
            kind: Kind::Dense,
            budget_mib: budget,
            tok_s,
            peak_mib: peak,
            smi_peak_mib: None,
            note: String::new(),
        }
    }

    #[test]
    fn bench_json_gives_the_tg_speed_and_the_budgeted_peak() {
        let dev = |peak: u64, outside: u64| json!({"device": {"peak_reserved": peak, "outside_allocator": outside}});
        let v = json!([
            {"test": "pp8", "ts_mean": 999.0},
            {"test": "tg32", "ts_mean": 41.5,
             "memory": dev(100 << 20, 5 << 20), "load_memory": dev(300 << 20, 4 << 20)}
        ]);
        let (t, p) = from_bench_json(&v).unwrap();
        assert_eq!(t, 41.5);
        assert_eq!(p, 305.0);
        assert!(from_bench_json(&json!([{"test": "pp8", "ts_mean": 1.0}])).is_err());
    }

    #[test]
    fn dips_and_overruns_are_reported_not_hidden() {
        let pts = [
            point(1000.0, Some(10.0), Some(900.0)),
            point(3000.0, Some(30.0), Some(3100.0)),
            point(2000.0, Some(20.0), Some(1900.0)),
            point(4000.0, Some(25.0), Some(3900.0)),
            point(500.0, None, None),
        ];
        let refs: Vec<&Point> = pts.iter().collect();
        let d = dips(&refs);
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].starts_with("4000 MiB: 25.0 tok/s after 30.0"), "{d:?}");
        let md = markdown(&pts);
        assert!(md.contains("not monotone"), "{md}");
        assert!(md.contains("1 runs exceeded their budget"), "{md}");
        assert!(md.contains("| 3000 | 30.0 | 3100 | **no** |"), "{md}");
        assert!(md.contains("`-ngl 33` | 5113 | 265.7"), "{md}");
        let monotone = [
            point(1.0, Some(1.0), Some(1.0)),
            point(2.0, Some(2.0), Some(2.0)),
        ];
        assert!(markdown(&monotone).contains("rises monotonically"));
    }

    #[test]
    fn the_tsv_is_read_with_refusals_as_notes() {
        let dir = std::env::temp_dir().join(format!("offload-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("ok.json"),
            json!([{"test": "tg8", "ts_mean": 12.0,
                    "memory": {"device": {"peak_reserved": 1u64 << 30, "outside_allocator": 0}}}])
            .to_string(),
        )
        .unwrap();
        std::fs::write(
            dir.join("no.log"),
            "note: x\nError: a GPU budget of 1 MiB is below\nlast line\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("points.tsv"),
            "# header\nm\tmoe\t2048\tok.json\t2600\nm\tmoe\t1\tno.log\t-\n",
        )
        .unwrap();
        let pts = read_points(&dir.join("points.tsv")).unwrap();
        assert_eq!(pts.len(), 2);
        assert_eq!(pts[0].tok_s, Some(12.0));
        assert_eq!(pts[0].peak_mib, Some(1024.0));
        assert_eq!(pts[0].smi_peak_mib, Some(2600.0));
        assert_eq!(pts[1].tok_s, None);
        assert!(pts[1].note.contains("below"), "{}", pts[1].note);
        std::fs::write(dir.join("bad.tsv"), "m\tmoe\t1\n").unwrap();
        assert!(read_points(&dir.join("bad.tsv")).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
