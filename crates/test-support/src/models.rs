//! Where tests find the workspace, the models folder and the real test model, and where they
//! write scratch files.
//!
//! The models folder and the real-model requirement are `gguf-loader`'s knobs
//! (`HIPDECODE_MODELS_DIR`, `HIPDECODE_REQUIRE_MODELS`); this module reads them only through
//! `gguf_loader`, so a test and `cargo xtask fetch-model` agree on the folder.

use std::path::{Path, PathBuf};

/// The workspace root (the folder of the root `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The models folder: `HIPDECODE_MODELS_DIR`, else `<workspace>/models`.
pub fn models_dir() -> PathBuf {
    gguf_loader::paths::models_dir()
}

/// The real Gemma 3 270M file, or `None` after a printed skip; a panic instead when
/// `HIPDECODE_REQUIRE_MODELS=1`, so a machine meant to have it cannot skip silently.
pub fn gemma_path() -> Option<PathBuf> {
    let path = gguf_loader::paths::gemma3_270m_path();
    if path.exists() {
        return Some(path);
    }
    skip_unless_required(&format!(
        "{} is absent (run `cargo xtask fetch-model gemma3-270m`)",
        path.display()
    ))
}

/// The real SmolLM2-135M-Instruct file (`cargo xtask fetch-model smollm2-135m`), or `None`
/// after a printed skip; a panic instead when `HIPDECODE_REQUIRE_MODELS=1`.
pub fn smollm2_path() -> Option<PathBuf> {
    let path = models_dir().join("smollm2-135m-instruct-q4_1.gguf");
    if path.exists() {
        return Some(path);
    }
    skip_unless_required(&format!(
        "{} is absent (run `cargo xtask fetch-model smollm2-135m`)",
        path.display()
    ))
}

/// `None` after printing why the calling test skips; a panic with `reason` instead when
/// `HIPDECODE_REQUIRE_MODELS=1`. For what a real-model test needs besides the model (the Python
/// references, for one).
pub fn skip_unless_required<T>(reason: &str) -> Option<T> {
    let test = current_test();
    let switch = &gguf_loader::knobs::REQUIRE_MODELS;
    assert!(
        !hip_ffi::testing::required(switch, &test),
        "{test}: {}=1 but {reason}",
        switch.name
    );
    eprintln!("skipping {test}: {reason}");
    None
}

/// `<temp>/hipdecode-<name>`, created: where a crate's tests write the models they build. Test
/// files put the process id (and the thread where tests share a name) in their file names, so
/// parallel runs do not collide.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hipdecode-{name}"));
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("creating the scratch folder {}: {e}", dir.display()));
    dir
}

/// The running test's name, for skip messages: the test harness names each test's thread
/// after the test.
fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_string()
}

/// Rewrites the type id of tensor `name` in the GGUF image `bytes` (in place): how a test
/// makes a file with a tensor of a type the loader cannot read. The tensor's index entry is
/// its name (u64 length, then the bytes), its dimension count (u32), its dimensions (u64 each),
/// then the type id (u32). Panics when the name is not in the image.
pub fn set_tensor_type(bytes: &mut [u8], name: &str, type_id: u32) {
    let name = name.as_bytes();
    let len = (name.len() as u64).to_le_bytes();
    let at = bytes
        .windows(name.len() + 8)
        .position(|w| w[..8] == len && &w[8..] == name)
        .unwrap_or_else(|| panic!("no tensor entry {:?}", String::from_utf8_lossy(name)));
    let dims_at = at + 8 + name.len();
    let n_dims = u32::from_le_bytes(bytes[dims_at..dims_at + 4].try_into().unwrap()) as usize;
    let type_at = dims_at + 4 + 8 * n_dims;
    bytes[type_at..type_at + 4].copy_from_slice(&type_id.to_le_bytes());
}

/// Rewrites the value of the u32 metadata key `key` in the GGUF image `bytes` (in place), e.g.
/// a model's context length. The entry is the key (u64 length, then the bytes), the value type
/// (u32, 4 for u32), then the value. Panics when the key is not in the image as a u32.
pub fn set_u32_metadata(bytes: &mut [u8], key: &str, value: u32) {
    let key = key.as_bytes();
    let len = (key.len() as u64).to_le_bytes();
    let at = bytes
        .windows(key.len() + 12)
        .position(|w| {
            w[..8] == len && &w[8..8 + key.len()] == key && w[8 + key.len()..] == 4u32.to_le_bytes()
        })
        .unwrap_or_else(|| panic!("no u32 metadata {:?}", String::from_utf8_lossy(key)));
    let value_at = at + 8 + key.len() + 4;
    bytes[value_at..value_at + 4].copy_from_slice(&value.to_le_bytes());
}

/// Makes row `row` of tensor `name` in the GGUF image `bytes` non-finite (in place): how a
/// test makes a model whose weights hold NaN or infinity there, as a corrupt download or a
/// conversion that overflowed leaves them. `value` (NaN, or an infinity) goes into every
/// element of an F32 or F16 row, and into the f16 scale of every block of a quantized row,
/// so each of its values dequantizes to NaN or an infinity (NaN where its quant is 0). Row
/// `r` of a matrix is its `r`-th run of `dims[0]` values: the embedding of token `r`, or
/// output `r` of a product. Panics on a finite `value`, a tensor not in the image, a row past
/// its end or a type this does not know the blocks of.
pub fn set_non_finite_row(bytes: &mut [u8], name: &str, row: usize, value: f32) {
    use gguf_loader::GgmlType as T;
    assert!(!value.is_finite(), "{value} is finite");
    let f16_bits: u16 = match value {
        v if v.is_nan() => 0x7e00,
        v if v > 0.0 => 0x7c00,
        _ => 0xfc00,
    };
    let file = gguf_loader::GgufFile::from_bytes(bytes.to_vec()).expect("a GGUF image");
    let t = file
        .tensor(name)
        .unwrap_or_else(|| panic!("no tensor {name}"));
    let cols = t.dims[0] as usize;
    let rows = (t.n_elements() as usize) / cols;
    assert!(row < rows, "row {row} of {name}, which has {rows}");
    let ty = t.ggml_type;
    let row_bytes = cols / ty.block_size() * ty.type_size();
    let start = (file.data_start() + t.offset) as usize + row * row_bytes;
    let data = &mut bytes[start..start + row_bytes];
    match ty {
        T::F32 => data
            .chunks_exact_mut(4)
            .for_each(|c| c.copy_from_slice(&value.to_le_bytes())),
        T::F16 => data
            .chunks_exact_mut(2)
            .for_each(|c| c.copy_from_slice(&f16_bits.to_le_bytes())),
        _ => {
            // Where each block keeps its f16 scale `d`: first, but last in Q6_K.
            let d_at = match ty {
                T::Q4_0 | T::Q5_0 | T::Q8_0 | T::Q4K | T::Q5K => 0,
                T::Q6K => 208,
                other => panic!(
                    "{name} is {}, whose blocks this does not know",
                    other.name()
                ),
            };
            for block in data.chunks_exact_mut(ty.type_size()) {
                block[d_at..d_at + 2].copy_from_slice(&f16_bits.to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_root_holds_the_workspace_manifest() {
        let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
        assert!(manifest.contains("[workspace]"), "{manifest}");
    }

    #[test]
    fn skip_messages_name_the_test() {
        assert_eq!(current_test(), "models::tests::skip_messages_name_the_test");
    }

    #[test]
    fn scratch_folders_exist_under_the_temp_folder() {
        let dir = scratch_dir("test-support-tests");
        assert!(dir.is_dir());
        assert!(dir.starts_with(std::env::temp_dir()));
    }
}
