//! The real Gemma 3 270M Q4_K_M file: index, metadata, model description.

use gguf_loader::{Architecture, GgmlType, GgufFile, ModelConfig};
use test_support::models::gemma_path;

#[test]
fn gemma_indexes_and_describes() {
    let Some(path) = gemma_path() else {
        return;
    };
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.tensors().len(), 236);
    assert_eq!(f.metadata_len(), 33);
    assert_eq!(f.get_str("general.architecture").unwrap(), "gemma3");
    assert_eq!(
        f.get_str_slice("tokenizer.ggml.tokens").unwrap().len(),
        262_144
    );
    assert_eq!(
        f.get_f32_array("tokenizer.ggml.scores").unwrap().len(),
        262_144
    );

    let embd = f.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.dims, vec![640, 262_144]);
    assert_eq!(embd.ggml_type, GgmlType::Q8_0);
    assert_eq!(f.tensor_data(embd).len() as u64, embd.n_bytes);
    // Every data slice is the mapping itself, not a copy: it lies at its offset in the image.
    let image = f.file_bytes().as_ptr() as usize;
    for t in f.tensors() {
        let at = f.tensor_data(t).as_ptr() as usize;
        assert_eq!(
            at - image,
            (f.data_start() + t.offset) as usize,
            "{}",
            t.name
        );
    }

    let c = ModelConfig::from_gguf(&f).unwrap();
    assert_eq!(c.architecture, Architecture::Gemma3);
    assert_eq!((c.n_layers, c.n_embd, c.n_ff), (18, 640, 2048));
    assert_eq!(
        (c.n_head, c.n_head_kv, c.head_dim_k, c.head_dim_v),
        (4, 1, 256, 256)
    );
    assert_eq!(c.sliding_window, Some(512));
    assert_eq!(c.sliding_window_pattern, Some(6));
    assert_eq!(c.rope_freq_base, 1_000_000.0);
    assert_eq!(c.rope_freq_base_local, Some(10_000.0));
    assert_eq!(c.vocab_size, 262_144);
    assert_eq!(c.context_length, 32_768);
    assert!(c.is_sliding_layer(0) && !c.is_sliding_layer(5) && c.is_sliding_layer(6));
}

/// Resident memory in bytes, from /proc (Linux only).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Opening reads the header only: resident memory grows by a small part of the 253 MB file.
#[test]
fn opening_does_not_read_tensor_data() {
    let Some(path) = gemma_path() else {
        return;
    };
    let Some(before) = resident_bytes() else {
        eprintln!("skipping opening_does_not_read_tensor_data: no /proc/self/statm");
        return;
    };
    let f = GgufFile::open(&path).unwrap();
    let total: u64 = f
        .tensors()
        .iter()
        .map(|t| f.tensor_data(t).len() as u64)
        .sum();
    let grown = resident_bytes().unwrap().saturating_sub(before);
    assert!(total > 240_000_000);
    // The header (vocabulary included) is 6.5 MB; allow for the index and allocator slack.
    assert!(
        grown < 48 << 20,
        "resident memory grew by {grown} bytes on open"
    );
}
