//! Printing results: the llama-bench style speed table and the memory table (md), an array of
//! test objects (json), or one line per test (csv).

use crate::explain::{explained_table, graph_table, stranded_lines, Explained};
use crate::measure::ModelReport;
use crate::model_info::{format_params, format_size};
use crate::phase_memory::{memory_table, Phase, PhaseMemory};
use crate::table::{csv_line, markdown, Column};
use decode::memory::GraphMemory;
use serde_json::{json, Value};

/// `mean ± sd` with two decimals, as llama-bench prints t/s.
pub fn mean_sd(mean: f64, sd: f64) -> String {
    format!("{mean:.2} ± {sd:.2}")
}

/// The speed table: one row per model and test.
pub fn speed_table(reports: &[ModelReport]) -> String {
    let columns = [
        Column::left("model"),
        Column::right("size"),
        Column::right("params"),
        Column::left("backend"),
        Column::right("test"),
        Column::right("t/s"),
        Column::right("median t/s"),
    ];
    let rows: Vec<Vec<String>> = reports
        .iter()
        .flat_map(|r| {
            r.tests.iter().map(move |t| {
                vec![
                    r.info.name.clone(),
                    format_size(r.info.size_bytes),
                    format_params(r.info.params),
                    r.backend.clone(),
                    t.name(),
                    mean_sd(t.summary.mean, t.summary.sd),
                    format!("{:.2}", t.summary.median),
                ]
            })
        })
        .collect();
    markdown(&columns, &rows)
}

/// Both Markdown tables with a line on what the memory columns mean.
pub fn markdown_report(reports: &[ModelReport]) -> String {
    let mut out = speed_table(reports);
    let rows: Vec<(String, PhaseMemory)> = reports
        .iter()
        .flat_map(|r| r.memory.iter().map(|m| (r.info.name.clone(), m.clone())))
        .collect();
    if !rows.is_empty() {
        out.push('\n');
        out.push_str(&memory_table(&rows));
        out.push_str(
            "\nTag columns: the most each tag held in the phase. \
             `peaks over` says what the peaks cover: the phase alone, or the process's \
             lifetime where a counter cannot be reset (peak RSS without \
             /proc/self/clear_refs).\n",
        );
        out.push_str(&explained_sections(reports));
    }
    out
}

/// The device's bytes explained per phase, the graphs' memory and any stranded bytes (empty
/// on the CPU backend).
fn explained_sections(reports: &[ModelReport]) -> String {
    let explained: Vec<(String, &Explained, &str)> = reports
        .iter()
        .flat_map(|r| {
            r.memory.iter().filter_map(move |m| {
                Some((r.info.name.clone(), m.explained.as_ref()?, m.phase.name()))
            })
        })
        .collect();
    if explained.is_empty() {
        return String::new();
    }
    let mut out = format!("\n{}", explained_table(&explained));
    // The graphs' books are cumulative, so the last phase has every capture.
    let graphs: Vec<(String, GraphMemory)> = reports
        .iter()
        .filter_map(|r| {
            Some((
                r.info.name.clone(),
                r.memory.last()?.explained.as_ref()?.graph,
            ))
        })
        .collect();
    out.push('\n');
    out.push_str(&graph_table(&graphs));
    let last: Vec<(String, &Explained)> = reports
        .iter()
        .filter_map(|r| Some((r.info.name.clone(), r.memory.last()?.explained.as_ref()?)))
        .collect();
    let stranded = stranded_lines(&last);
    if !stranded.is_empty() {
        out.push('\n');
        out.push_str(&stranded);
    }
    out
}

/// One object per model and test, with every number: llama-bench's fields
/// ([`crate::llama_bench`]), then the repetitions' t/s, their summary, the memory of the test's
/// phase and of the load.
pub fn json_report(reports: &[ModelReport]) -> Value {
    let tests: Vec<Value> = reports
        .iter()
        .flat_map(|r| {
            r.tests.iter().map(move |t| {
                let s = &t.summary;
                let ours = json!({
                    "model": r.info.name,
                    "model_path": r.info.path,
                    "size_bytes": r.info.size_bytes,
                    "params": r.info.params,
                    "backend": r.backend,
                    "test": t.name(),
                    "n_prompt": if t.phase() == Phase::Prefill { t.tokens } else { 0 },
                    "n_gen": if t.phase() == Phase::Decode { t.tokens } else { 0 },
                    "n_depth": t.depth,
                    "warmup": r.warmup,
                    "repetitions": t.samples.len(),
                    "ts": t.samples,
                    "ts_mean": s.mean,
                    "ts_sd": s.sd,
                    "ts_median": s.median,
                    "ts_min": s.min,
                    "ts_max": s.max,
                    "ts_mad": s.mad,
                    "memory": r.phase(t.phase()).map(PhaseMemory::to_json),
                    "load_memory": r.phase(Phase::Load).map(PhaseMemory::to_json),
                });
                // llama-bench's fields first, then ours; the three both have agree.
                let mut object = crate::llama_bench::record(r, t);
                if let Value::Object(ours) = ours {
                    object.extend(ours);
                }
                Value::Object(object)
            })
        })
        .collect();
    Value::Array(tests)
}

/// A header line and one line per model and test; the memory of the test's phase and of the
/// load follow the speed columns (bytes; empty where unknown).
pub fn csv_report(reports: &[ModelReport]) -> String {
    let mut header: Vec<String> = [
        "model",
        "model_path",
        "size_bytes",
        "params",
        "backend",
        "test",
        "repetitions",
        "ts_mean",
        "ts_sd",
        "ts_median",
        "ts_min",
        "ts_max",
        "ts_samples",
        "phase",
    ]
    .map(String::from)
    .to_vec();
    header.extend(PhaseMemory::csv_headers("mem_"));
    header.extend(PhaseMemory::csv_headers("load_mem_"));
    let mut out = csv_line(&header);
    for r in reports {
        for t in &r.tests {
            let s = &t.summary;
            let mut row = vec![
                r.info.name.clone(),
                r.info.path.clone(),
                r.info.size_bytes.to_string(),
                r.info.params.to_string(),
                r.backend.clone(),
                t.name(),
                t.samples.len().to_string(),
                s.mean.to_string(),
                s.sd.to_string(),
                s.median.to_string(),
                s.min.to_string(),
                s.max.to_string(),
                // One field: the repetitions separated by semicolons.
                t.samples
                    .iter()
                    .map(f64::to_string)
                    .collect::<Vec<_>>()
                    .join(";"),
                t.phase().name().to_string(),
            ];
            let blank = || vec![String::new(); PhaseMemory::csv_headers("").len()];
            row.extend(
                r.phase(t.phase())
                    .map_or_else(blank, PhaseMemory::csv_cells),
            );
            row.extend(
                r.phase(Phase::Load)
                    .map_or_else(blank, PhaseMemory::csv_cells),
            );
            out.push_str(&csv_line(&row));
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::measure::{TestKind, TestResult};
    use crate::model_info::ModelInfo;
    use crate::stats::summarize;
    use decode::memory::{MemoryReport, MemoryTag};

    fn phase(p: Phase) -> PhaseMemory {
        let mut now = MemoryReport {
            location: "host".into(),
            ..MemoryReport::default()
        };
        now.add(MemoryTag::Weights, 3 << 20);
        now.add(MemoryTag::KvCache, 4096);
        let mut m = PhaseMemory::from_host(p, &now, &[0; MemoryTag::COUNT]);
        m.rss = Some(50 << 20);
        m.peak_rss = Some(60 << 20);
        m
    }

    pub(crate) fn report() -> ModelReport {
        let test = |kind, tokens, samples: Vec<f64>| TestResult {
            kind,
            tokens,
            depth: 0,
            summary: summarize(&samples).unwrap(),
            samples,
            started: "2026-12-06T02:05:01Z".into(),
        };
        ModelReport {
            info: ModelInfo {
                name: "tiny, llama.gguf".into(),
                path: "/m/tiny, llama.gguf".into(),
                size_bytes: 1 << 30,
                params: 1_500_000_000,
            },
            backend: "cpu (2 threads, 16-bit integer activations)".into(),
            setup: crate::run_setup::RunSetup {
                backends: "CPU".into(),
                gpu_info: String::new(),
                cpu_info: "a test CPU".into(),
                model_type: "llama 1.50 B Q4_K".into(),
                n_threads: 2,
                kv_type: "f32".into(),
                n_gpu_layers: 0,
                n_batch: 512,
                flash_attn: false,
            },
            warmup: 1,
            tests: vec![
                test(TestKind::Pp, 512, vec![100.0, 110.0, 90.0]),
                test(TestKind::Tg, 128, vec![20.0, 21.0]),
            ],
            memory: vec![
                phase(Phase::Load),
                phase(Phase::Prefill),
                phase(Phase::Decode),
            ],
        }
    }

    #[test]
    fn speed_table_reads_like_llama_bench() {
        let t = speed_table(&[report()]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[0].starts_with("| model "), "{t}");
        assert!(
            lines[0].contains("| t/s ") || lines[0].contains(" t/s |"),
            "{t}"
        );
        assert!(
            lines[2].contains("| 1.00 GiB |") && lines[2].contains("| 1.50 B |"),
            "{t}"
        );
        assert!(
            lines[2].contains("pp512") && lines[2].contains("100.00 ± 10.00"),
            "{t}"
        );
        assert!(
            lines[3].contains("tg128") && lines[3].contains("20.50 ± 0.71"),
            "{t}"
        );
        // Every line is as wide as the header.
        let w = lines[0].chars().count();
        assert!(lines.iter().all(|l| l.chars().count() == w), "{t}");
    }

    #[test]
    fn markdown_report_has_a_memory_row_per_phase() {
        let t = markdown_report(&[report()]);
        for p in ["| load ", "| prefill ", "| decode "] {
            assert!(t.contains(p), "{p}: {t}");
        }
        assert!(t.contains("3.0 MiB") && t.contains("60.0 MiB"), "{t}");
    }

    #[test]
    fn json_has_every_repetition_and_the_phase_memory() {
        let j = json_report(&[report()]);
        let a = j.as_array().unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0]["test"], "pp512");
        assert_eq!(a[0]["ts"].as_array().unwrap().len(), 3);
        assert_eq!(a[0]["ts_median"], 100.0);
        assert_eq!(a[0]["n_prompt"], 512);
        assert_eq!(a[0]["memory"]["phase"], "prefill");
        assert_eq!(a[1]["memory"]["phase"], "decode");
        assert_eq!(a[1]["load_memory"]["tags"]["weights"]["peak"], 3u64 << 20);
        assert_eq!(a[1]["memory"]["peak_rss"], 60u64 << 20);
        assert!(a[1]["memory"]["device"].is_null());
    }

    #[test]
    fn csv_has_one_header_and_a_line_per_test_of_equal_width() {
        let c = csv_report(&[report()]);
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(lines.len(), 3, "{c}");
        assert!(lines[0].starts_with("model,model_path,size_bytes,params,backend,test,"));
        assert!(lines[0].contains(",mem_weights_peak,") && lines[0].contains(",load_mem_rss,"));
        // Fields outside quotes (the model name, path and backend hold commas).
        let fields = |l: &str| {
            let mut quoted = false;
            1 + l
                .chars()
                .filter(|&ch| {
                    if ch == '"' {
                        quoted = !quoted;
                    }
                    ch == ',' && !quoted
                })
                .count()
        };
        assert_eq!(fields(lines[1]), fields(lines[0]), "{c}");
        assert_eq!(fields(lines[2]), fields(lines[0]), "{c}");
        assert!(lines[1].contains("\"tiny, llama.gguf\""));
        assert!(lines[1].contains(",100;110;90,prefill,"), "{c}");
        assert!(lines[2].contains(",tg128,2,20.5,"), "{c}");
    }
}
