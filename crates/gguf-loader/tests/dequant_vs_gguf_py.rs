//! Bit-exactness of the CPU dequantizer against gguf-py's `gguf.quants.dequantize`.

mod common;

use common::{gguf_py_available, run_reference, sha256_f32_le};
use gguf_loader::{GgmlType, GgufFile};
use test_support::models::gemma_path;

/// Every tensor of the real Gemma file: sha256 of our f32 output equals gguf-py's.
#[test]
fn real_gemma_every_tensor_matches_gguf_py() {
    let test = "real_gemma_every_tensor_matches_gguf_py";
    let Some(path) = gemma_path() else {
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

/// One random tensor of every type, written by gguf-py: the file indexes with the sizes
/// gguf-py used, and every type gguf-py can dequantize matches it element for element.
#[test]
fn gguf_py_written_tensors_of_every_type_match() {
    let test = "gguf_py_written_tensors_of_every_type_match";
    if !gguf_py_available(test) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("gguf-loader-types-{}", std::process::id()));
    for seed in ["1", "2"] {
        let _ = std::fs::remove_dir_all(&dir);
        run_reference("gguf_synth_types.py", &[dir.as_os_str(), seed.as_ref()]);
        let f = GgufFile::open(dir.join("types.gguf")).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for t in f.tensors() {
            assert_eq!(t.n_bytes as usize, f.tensor_data(t).len());
            seen.insert(t.ggml_type);
            let reference = dir.join(format!("{}.f32", t.name));
            if !reference.exists() {
                assert!(
                    !t.ggml_type.can_dequantize() || t.ggml_type == GgmlType::Q8K,
                    "{}",
                    t.name
                );
                continue;
            }
            let expected: Vec<u32> = std::fs::read(&reference)
                .unwrap()
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let ours = f.dequantize_tensor(t).unwrap();
            assert_eq!(ours.len(), expected.len(), "{}", t.name);
            if let Some(i) = (0..ours.len()).find(|&i| ours[i].to_bits() != expected[i]) {
                panic!(
                    "{} ({}): element {i} is {} here, {} in gguf-py",
                    t.name,
                    t.ggml_type,
                    ours[i],
                    f32::from_bits(expected[i])
                );
            }
        }
        assert_eq!(
            seen.len(),
            GgmlType::ALL.len(),
            "every supported type was written"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
