//! The output of `--npl` in md, json and csv: one row per model and batch size, with
//! llama-batched-bench's columns and the memory ones.

use crate::batched::{BatchedReport, BatchedRow};
use crate::table::{csv_line, markdown, Column};
use decode::memory::human_bytes;
use serde_json::{json, Value};

/// The Markdown table's columns after the model's.
const COLUMNS: [&str; 12] = [
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
];

fn peak(row: &BatchedRow) -> String {
    row.peak_device
        .map_or_else(|| "n/a".to_string(), human_bytes)
}

/// One table for every model: model and backend, then llama-batched-bench's columns, the
/// KV cache and the peak device memory of each row.
pub fn markdown_report(reports: &[BatchedReport]) -> String {
    let mut columns = vec![Column::left("model"), Column::left("backend")];
    columns.extend(COLUMNS.iter().map(|&c| Column::right(c)));
    let rows: Vec<Vec<String>> = reports
        .iter()
        .flat_map(|r| {
            r.rows.iter().map(move |row| {
                vec![
                    r.info.name.clone(),
                    r.backend.clone(),
                    row.pp.to_string(),
                    row.tg.to_string(),
                    row.b.to_string(),
                    row.n_kv.to_string(),
                    format!("{:.3}", row.t_pp),
                    format!("{:.2}", row.s_pp()),
                    format!("{:.3}", row.t_tg),
                    format!("{:.2}", row.s_tg()),
                    format!("{:.3}", row.t()),
                    format!("{:.2}", row.s()),
                    human_bytes(row.kv_bytes),
                    peak(row),
                ]
            })
        })
        .collect();
    let mut out = markdown(&columns, &rows);
    out.push_str(
        "\nS_PP = B × PP ÷ T_PP, S_TG = B × TG ÷ T_TG, S = N_KV ÷ T (llama-batched-bench's). \
         KV bytes: the context's KV cache. peak device: the allocator's peak reserved bytes in \
         the row plus the device memory held outside it (n/a on the CPU).\n",
    );
    out
}

fn json_row(r: &BatchedReport, row: &BatchedRow) -> Value {
    json!({
        "model": r.info.name,
        "model_path": r.info.path,
        "backend": r.backend,
        "warmup": r.warmup,
        "max_batch": r.max_batch,
        "pp": row.pp,
        "tg": row.tg,
        "b": row.b,
        "n_kv": row.n_kv,
        "t_pp": row.t_pp,
        "s_pp": row.s_pp(),
        "t_tg": row.t_tg,
        "s_tg": row.s_tg(),
        "t": row.t(),
        "s": row.s(),
        "kv_bytes": row.kv_bytes,
        "peak_device_bytes": row.peak_device,
    })
}

/// One object per model and batch size; times in seconds, rates in tokens per second,
/// memory in bytes (`peak_device_bytes` null on the CPU).
pub fn json_report(reports: &[BatchedReport]) -> Value {
    Value::Array(
        reports
            .iter()
            .flat_map(|r| r.rows.iter().map(move |row| json_row(r, row)))
            .collect(),
    )
}

/// A header line and one line per model and batch size, with the JSON's fields (the peak
/// empty on the CPU).
pub fn csv_report(reports: &[BatchedReport]) -> String {
    let header = [
        "model",
        "model_path",
        "backend",
        "pp",
        "tg",
        "b",
        "n_kv",
        "t_pp",
        "s_pp",
        "t_tg",
        "s_tg",
        "t",
        "s",
        "kv_bytes",
        "peak_device_bytes",
    ];
    let mut out = csv_line(&header);
    for r in reports {
        for row in &r.rows {
            out.push_str(&csv_line(&[
                r.info.name.clone(),
                r.info.path.clone(),
                r.backend.clone(),
                row.pp.to_string(),
                row.tg.to_string(),
                row.b.to_string(),
                row.n_kv.to_string(),
                row.t_pp.to_string(),
                row.s_pp().to_string(),
                row.t_tg.to_string(),
                row.s_tg().to_string(),
                row.t().to_string(),
                row.s().to_string(),
                row.kv_bytes.to_string(),
                row.peak_device.map_or_else(String::new, |b| b.to_string()),
            ]));
        }
    }
    out
}
