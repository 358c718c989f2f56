//! llama-bench's JSON record (`llama-bench -o json`): every key it writes, with its JSON type
//! and unit, so that scripts written for llama-bench's output read bench-decode's. The keys
//! are llama.cpp's at commit d32676d (`tools/llama-bench/llama-bench.cpp`, `test::get_fields`
//! and the two sample arrays after them); `tests/data/llama-bench-h100-2026-12-06.json` is one
//! such output captured on the device (an H100 that day), and an end-to-end test checks that
//! bench-decode writes each of its keys with the same type and unit.
//!
//! Settings that llama.cpp has and hipdecode has not (thread pinning, tensor split, buffer
//! overrides) carry the value llama-bench writes when they are left at their defaults, so a
//! script that filters on them keeps working; the fields bench-decode adds of its own sit
//! beside these in the same object.

use crate::measure::{ModelReport, TestResult};
use serde_json::{json, Map, Value};

/// The keys llama-bench writes for a test, in its order (a record is a JSON object, so its own
/// order is serde_json's).
pub const KEYS: &[&str] = &[
    "build_commit",
    "build_number",
    "cpu_info",
    "gpu_info",
    "backends",
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "n_batch",
    "n_ubatch",
    "n_threads",
    "cpu_mask",
    "cpu_strict",
    "poll",
    "type_k",
    "type_v",
    "n_gpu_layers",
    "n_cpu_moe",
    "split_mode",
    "main_gpu",
    "no_kv_offload",
    "flash_attn",
    "devices",
    "tensor_split",
    "tensor_buft_overrides",
    "load_mode",
    "embeddings",
    "no_op_offload",
    "no_host",
    "fit_target",
    "fit_min_ctx",
    "n_prompt",
    "n_gen",
    "n_depth",
    "test_time",
    "avg_ns",
    "stddev_ns",
    "avg_ts",
    "stddev_ts",
    "samples_ns",
    "samples_ts",
];

/// One repetition's time in nanoseconds, from its tokens per second.
fn nanoseconds(tokens: usize, tokens_per_second: f64) -> u64 {
    (tokens as f64 * 1e9 / tokens_per_second).round() as u64
}

/// Mean and sample standard deviation (n - 1), 0 for one sample, as llama-bench computes them.
fn mean_sd(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, 0.0);
    }
    let ss: f64 = values.iter().map(|v| (v - mean).powi(2)).sum();
    (mean, (ss / (n - 1.0)).sqrt())
}

/// llama-bench's fields for one test of one model.
pub fn record(report: &ModelReport, test: &TestResult) -> Map<String, Value> {
    let setup = &report.setup;
    let (n_prompt, n_gen) = match test.phase() {
        crate::phase_memory::Phase::Prefill => (test.tokens, 0),
        _ => (0, test.tokens),
    };
    let samples_ns: Vec<u64> = (test.samples.iter())
        .map(|&ts| nanoseconds(test.tokens, ts))
        .collect();
    let ns: Vec<f64> = samples_ns.iter().map(|&n| n as f64).collect();
    let (avg_ns, stddev_ns) = mean_sd(&ns);
    let (avg_ts, stddev_ts) = mean_sd(&test.samples);
    let fields: [(&str, Value); 42] = [
        (
            "build_commit",
            json!(concat!("hipdecode-", env!("CARGO_PKG_VERSION"))),
        ),
        ("build_number", json!(0)),
        ("cpu_info", json!(setup.cpu_info)),
        ("gpu_info", json!(setup.gpu_info)),
        ("backends", json!(setup.backends)),
        ("model_filename", json!(report.info.path)),
        ("model_type", json!(setup.model_type)),
        ("model_size", json!(report.info.size_bytes)),
        ("model_n_params", json!(report.info.params)),
        ("n_batch", json!(setup.n_batch)),
        ("n_ubatch", json!(setup.n_batch)),
        ("n_threads", json!(setup.n_threads)),
        ("cpu_mask", json!("0x0")),
        ("cpu_strict", json!(false)),
        ("poll", json!(50)),
        ("type_k", json!(setup.kv_type)),
        ("type_v", json!(setup.kv_type)),
        ("n_gpu_layers", json!(setup.n_gpu_layers)),
        ("n_cpu_moe", json!(0)),
        // One device, so nothing is split.
        ("split_mode", json!("none")),
        ("main_gpu", json!(0)),
        ("no_kv_offload", json!(false)),
        ("flash_attn", json!(u8::from(setup.flash_attn))),
        ("devices", json!("auto")),
        ("tensor_split", json!("0.00")),
        ("tensor_buft_overrides", json!("none")),
        ("load_mode", json!("mmap")),
        ("embeddings", json!(false)),
        ("no_op_offload", json!(0)),
        ("no_host", json!(false)),
        ("fit_target", json!(0)),
        ("fit_min_ctx", json!(0)),
        ("n_prompt", json!(n_prompt)),
        ("n_gen", json!(n_gen)),
        ("n_depth", json!(test.depth)),
        ("test_time", json!(test.started)),
        ("avg_ns", json!(avg_ns.round() as u64)),
        ("stddev_ns", json!(stddev_ns.round() as u64)),
        ("avg_ts", json!(avg_ts)),
        ("stddev_ts", json!(stddev_ts)),
        ("samples_ns", json!(samples_ns)),
        ("samples_ts", json!(test.samples)),
    ];
    (fields.into_iter())
        .map(|(key, value)| (key.to_string(), value))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_has_every_llama_bench_key_once() {
        let report = crate::report::tests::report();
        let record = record(&report, &report.tests[1]);
        let mut keys: Vec<&str> = record.keys().map(String::as_str).collect();
        let mut expected = KEYS.to_vec();
        keys.sort_unstable();
        expected.sort_unstable();
        assert_eq!(keys, expected);
        assert_eq!(record["n_prompt"], 0);
        assert_eq!(record["n_gen"], 128);
        // 20 and 21 t/s over 128 tokens.
        assert_eq!(
            record["samples_ns"],
            json!([6_400_000_000u64, 6_095_238_095u64])
        );
        assert_eq!(record["avg_ts"], 20.5);
    }

    #[test]
    fn nanoseconds_invert_the_rate() {
        assert_eq!(nanoseconds(128, 256.0), 500_000_000);
    }

    #[test]
    fn mean_and_sample_sd_as_llama_bench() {
        let (m, sd) = mean_sd(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(m, 5.0);
        assert!((sd - (32.0f64 / 7.0).sqrt()).abs() < 1e-12, "{sd}");
        assert_eq!(mean_sd(&[3.0]), (3.0, 0.0));
    }
}
