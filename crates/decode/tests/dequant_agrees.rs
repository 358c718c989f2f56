//! decode's row dequantization (what its CPU kernels and the GPU backend's vectors use) equals
//! gguf-loader's `dequantize` exactly, on every tensor of every tiny synthetic model and, when
//! present, of real Gemma 3 270M, and on random rows of every type decode reads (dense rows of
//! any length). Equal as numbers: +0 and -0 count as equal (a zero quant times a negative scale
//! is -0 in one evaluation order and +0 in another); NaN never does, except in random bits.

mod common;

use common::*;
use decode::gguf_loader::quant::dequantize;
use decode::gguf_loader::synth::Preset;
use decode::gguf_loader::{GgmlType, GgufFile};
use decode::quant::{self, row_to_f32};
use rand::Rng;
use test_support::models::gemma_path;

/// Compares every row of every tensor whose format decode supports; returns how many rows.
fn check_file(file: &GgufFile, label: &str) -> usize {
    let mut rows_checked = 0;
    for t in file.tensors() {
        let format = t.ggml_type;
        if !quant::is_supported(format) {
            continue;
        }
        let cols = t.dims[0] as usize;
        let rows: usize = t.dims[1..].iter().map(|&d| d as usize).product();
        let bytes = file.tensor_data(t);
        let row_bytes = quant::row_bytes(format, cols).expect("whole blocks");
        assert_eq!(bytes.len(), row_bytes * rows, "{label} {}", t.name);
        let mut want = vec![0f32; cols * rows];
        dequantize(t.ggml_type, bytes, &mut want).expect("gguf-loader dequantizes it");
        let mut got = vec![0f32; cols];
        for (r, (src, want_row)) in bytes
            .chunks_exact(row_bytes)
            .zip(want.chunks_exact(cols))
            .enumerate()
        {
            row_to_f32(format, src, &mut got);
            for (c, (g, w)) in got.iter().zip(want_row).enumerate() {
                assert!(
                    g == w,
                    "{label} {} ({}) row {r} col {c}: decode {g}, gguf-loader {w}",
                    t.name,
                    format
                );
            }
            rows_checked += 1;
        }
    }
    rows_checked
}

#[test]
fn row_dequantization_equals_gguf_loader_on_the_tiny_models() {
    let mut formats = std::collections::BTreeSet::new();
    for preset in [
        Preset::TinyLlama,
        Preset::TinyQwen3,
        Preset::TinyQwen3Moe,
        Preset::TinyGemma3,
    ] {
        let file = preset_file(preset);
        for t in file.tensors() {
            formats.insert(t.ggml_type.name());
        }
        assert!(check_file(&file, preset.name()) > 0, "{}", preset.name());
    }
    eprintln!("formats compared: {formats:?}");
}

#[test]
fn row_dequantization_equals_gguf_loader_on_real_gemma() {
    let Some(path) = gemma_path() else { return };
    let file = decode::open_model(&path).unwrap();
    let rows = check_file(&file, "gemma3-270m");
    eprintln!("gemma3-270m: {rows} rows compared");
}

/// Random bytes as rows of every supported type, dense rows of odd lengths included. Random
/// bits make some f16 scales (and dense values) infinite or NaN, so here NaN matches NaN.
#[test]
fn row_dequantization_equals_gguf_loader_on_random_rows_of_every_supported_type() {
    let mut rng = test_support::rng::seeded(0x9E37_79B9_7F4A_7C15);
    for format in quant::SUPPORTED {
        let lengths: &[usize] = if quant::is_float(format) {
            &[1, 7, 301]
        } else {
            &[format.block_size(), 3 * format.block_size()]
        };
        for &cols in lengths {
            let n_bytes = quant::row_bytes(format, cols).expect("whole blocks");
            let bytes: Vec<u8> = (0..n_bytes).map(|_| rng.random()).collect();
            let mut want = vec![0f32; cols];
            dequantize(format, &bytes, &mut want).expect("gguf-loader dequantizes it");
            let mut got = vec![0f32; cols];
            row_to_f32(format, &bytes, &mut got);
            for (c, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g == w || (g.is_nan() && w.is_nan()),
                    "{format} x {cols} col {c}: decode {g}, gguf-loader {w}"
                );
            }
        }
    }
    // The dense types are what make odd lengths possible at all.
    assert!(quant::row_bytes(GgmlType::Q8_0, 7).is_none());
}
