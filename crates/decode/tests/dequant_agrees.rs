//! decode's row dequantization (what its CPU kernels and the GPU backend's vectors use) equals
//! gguf-loader's `dequantize` exactly, on every tensor of every tiny synthetic model and, when
//! present, of real Gemma 3 270M. Equal as numbers: +0 and -0 count as equal (a zero quant
//! times a negative scale is -0 in one evaluation order and +0 in another); NaN never does.

mod common;

use common::*;
use decode::gguf_loader::quant::dequantize;
use decode::gguf_loader::synth::Preset;
use decode::gguf_loader::GgufFile;
use decode::quant::{row_to_f32, WeightFormat};

/// Compares every row of every tensor whose format decode supports; returns how many rows.
fn check_file(file: &GgufFile, label: &str) -> usize {
    let mut rows_checked = 0;
    for t in file.tensors() {
        let Some(format) = WeightFormat::from_ggml_name(t.ggml_type.name()) else {
            continue;
        };
        let cols = t.dims[0] as usize;
        let rows: usize = t.dims[1..].iter().map(|&d| d as usize).product();
        let bytes = file.tensor_data(t);
        let row_bytes = format.row_bytes(cols).expect("whole blocks");
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
                    format.name()
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
