//! Phi-3's fused tensors seen as separate ones (`gguf_loader`'s fused views): each part is the
//! fused tensor's rows, in order, at no copy; a fused tensor whose rows do not match the
//! metadata is an error naming it.

use gguf_loader::synth::{preset_bytes, Preset};
use gguf_loader::{GgufError, GgufFile};

fn phi3() -> GgufFile {
    GgufFile::from_bytes(preset_bytes(Preset::TinyPhi3, 11).unwrap()).unwrap()
}

#[test]
fn q_k_and_v_are_the_fused_tensors_rows_in_order() {
    let f = phi3();
    let spec = Preset::TinyPhi3.spec();
    let (e, hd) = (spec.n_embd as u64, spec.head_dim as u64);
    for il in 0..spec.n_layers {
        let name = |t: &str| format!("blk.{il}.{t}.weight");
        let qkv = f
            .tensor(&name("attn_qkv"))
            .expect("the fused tensor is listed");
        let fused = f.tensor_data(qkv);
        let mut at = 0usize;
        for (part, heads) in [
            ("attn_q", spec.n_head),
            ("attn_k", spec.n_head_kv),
            ("attn_v", spec.n_head_kv),
        ] {
            let t = f
                .tensor(&name(part))
                .unwrap_or_else(|| panic!("{part} is a view"));
            assert_eq!(t.dims, [e, heads as u64 * hd], "{part}");
            assert_eq!(t.ggml_type, qkv.ggml_type);
            let bytes = f.tensor_data(t);
            assert_eq!(bytes, &fused[at..at + bytes.len()], "{part}'s bytes");
            at += bytes.len();
        }
        assert_eq!(at, fused.len(), "the parts cover the fused tensor");
    }
}

#[test]
fn the_gate_is_the_first_half_of_the_fused_up_and_up_the_second() {
    let f = phi3();
    let n_ff = Preset::TinyPhi3.spec().n_ff as u64;
    let fused = f
        .file_tensor("blk.0.ffn_up.weight")
        .expect("the file's own ffn_up is listed");
    assert!(f.tensors().iter().any(|t| std::ptr::eq(t, fused)));
    assert_eq!(fused.dims[1], 2 * n_ff);
    let whole = f.tensor_data(fused);
    let gate = f.tensor("blk.0.ffn_gate.weight").expect("a view");
    let up = f
        .tensor("blk.0.ffn_up.weight")
        .expect("the view shadows the fused tensor");
    assert_eq!((gate.dims[1], up.dims[1]), (n_ff, n_ff));
    let half = whole.len() / 2;
    assert_eq!(f.tensor_data(gate), &whole[..half]);
    assert_eq!(f.tensor_data(up), &whole[half..]);
}

#[test]
fn the_file_listing_shows_what_the_file_holds() {
    let f = phi3();
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"blk.0.attn_qkv.weight"));
    assert!(!names.contains(&"blk.0.attn_q.weight") && !names.contains(&"blk.0.ffn_gate.weight"));
}

#[test]
fn a_fused_tensor_that_the_head_counts_do_not_fill_is_refused_naming_it() {
    let mut bytes = preset_bytes(Preset::TinyPhi3, 11).unwrap();
    // One more K/V head than the fused rows hold.
    let kv = Preset::TinyPhi3.spec().n_head_kv as u32;
    set_u32(&mut bytes, "phi3.attention.head_count_kv", kv * 2);
    let err = GgufFile::from_bytes(bytes).expect_err("the rows do not match");
    let text = err.to_string();
    assert!(matches!(err, GgufError::Invalid { .. }), "{err:?}");
    assert!(
        text.contains("blk.0.attn_qkv.weight") && text.contains("rows"),
        "{text}"
    );
}

/// A hostile block count does not make the file index walk billions of layers looking for
/// fused tensors: the file opens at once, as any other with that count does. (Not a timing
/// bound: walking 4e9 layers takes minutes, which the test harness would show as a hang.)
#[test]
fn a_huge_block_count_does_not_walk_its_layers() {
    let mut bytes = preset_bytes(Preset::TinyPhi3, 11).unwrap();
    set_u32(&mut bytes, "phi3.block_count", u32::MAX);
    let f = GgufFile::from_bytes(bytes).expect("the index opens; the model's checks refuse it");
    assert!(
        f.tensor("blk.0.attn_q.weight").is_some(),
        "the real layers still have views"
    );
}

/// Overwrites a u32 metadata value in place (the key's bytes, then its type, then the value).
fn set_u32(bytes: &mut [u8], key: &str, value: u32) {
    let at = bytes
        .windows(key.len())
        .position(|w| w == key.as_bytes())
        .unwrap_or_else(|| panic!("{key} is in the file"));
    let value_at = at + key.len() + 4; // after the u32 type tag
    bytes[value_at..value_at + 4].copy_from_slice(&value.to_le_bytes());
}
