//! Bit-exactness of the CPU dequantizer against gguf-py's `gguf.quants.dequantize`.

mod common;

use common::{gguf_py_available, run_reference, sha256_f32_le};
use gguf_loader::paths::gemma3_270m_for_test;
use gguf_loader::GgufFile;

/// Every tensor of the real Gemma file: sha256 of our f32 output equals gguf-py's.
#[test]
fn real_gemma_every_tensor_matches_gguf_py() {
    let test = "real_gemma_every_tensor_matches_gguf_py";
    let Some(path) = gemma3_270m_for_test(test) else {
        return;
    };
    if !gguf_py_available(test) {
        return;
    }
    let reference = run_reference("gguf_dequant_hashes.py", &[path.as_os_str()]);
    let f = GgufFile::open(&path).unwrap();
    let mut checked = 0;
    for line in reference.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        let [name, ty, n, digest] = fields[..] else {
            panic!("unexpected reference line {line:?}");
        };
        let t = f
            .tensor(name)
            .unwrap_or_else(|| panic!("gguf-py lists {name}, we do not"));
        assert_eq!(t.ggml_type.name(), ty, "{name}");
        assert_eq!(t.n_elements().to_string(), n, "{name}");
        let values = f.dequantize_tensor(t).unwrap();
        assert_eq!(
            sha256_f32_le(&values),
            digest,
            "{name} ({ty}) differs from gguf-py"
        );
        checked += 1;
    }
    assert_eq!(
        checked,
        f.tensors().len(),
        "gguf-py and we list different tensor counts"
    );
}
