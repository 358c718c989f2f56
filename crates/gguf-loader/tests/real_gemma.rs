//! The real Gemma 3 270M Q4_K_M file: index, metadata, model description.

use gguf_loader::paths::gemma3_270m_for_test;
use gguf_loader::{Architecture, GgmlType, GgufFile, ModelConfig};

#[test]
fn gemma_indexes_and_describes() {
    let Some(path) = gemma3_270m_for_test("gemma_indexes_and_describes") else {
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
    // The data slice is the mapping itself, not a copy: its address lies inside the file image.
    let data = f.tensor_data(embd);
    let first = f.tensor_data(&f.tensors()[0]).as_ptr() as usize;
    assert!(data.as_ptr() as usize > first);

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
