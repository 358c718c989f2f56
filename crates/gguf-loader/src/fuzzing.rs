//! The hostile-input harness shared by the cargo-fuzz target and the proptest: open arbitrary
//! bytes and, if they index, use everything the file offers. Any panic is a bug.

use crate::{inspect, GgufFile, ModelConfig};

/// Opens `data` as a GGUF image and, when it opens, reads every metadata value through the
/// typed accessors, dequantizes every tensor, describes the model and renders both reports.
/// Returns whether the bytes opened (for statistics only).
pub fn exercise(data: &[u8]) -> bool {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return false;
    };
    let keys: Vec<String> = f.metadata().map(|(k, _)| k.to_owned()).collect();
    for key in &keys {
        let _ = f.get_u32(key);
        let _ = f.get_f32(key);
        let _ = f.get_str(key);
        let _ = f.get_str_array(key);
        let _ = f.get_f32_array(key);
        let _ = f.get_i32_array(key);
        if let Some(array) = f.get(key).and_then(|v| v.as_array()) {
            array.iter().for_each(drop);
        }
    }
    for t in f.tensors() {
        assert_eq!(
            f.tensor_data(t).len() as u64,
            t.n_bytes,
            "indexed tensors lie inside the file"
        );
        let _ = f.dequantize_tensor(t);
    }
    let _ = ModelConfig::from_gguf(&f);
    let _ = inspect::json_report(&f);
    let _ = inspect::write_text_report(&f, &mut std::io::sink());
    true
}
