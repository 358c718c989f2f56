//! The weight formats that no synthetic preset stores (Q2_K, Q3_K, IQ4_NL, IQ4_XS), end to end
//! on the CPU against the numpy reference, which dequantizes with gguf-py: the tiny Qwen3 MoE
//! model with every weight that is not f32 (attention, routed experts, embeddings, output)
//! stored in the format, logits at every position at both precisions. The GPU backend runs the
//! same models in gpu_backend.rs.

mod common;

use common::*;
use decode::gguf_loader::synth::Preset;
use decode::gguf_loader::{GgmlType, GgufFile};
use decode::tokenizer::Tokenizer;
use std::sync::Arc;

fn check(ty: GgmlType) {
    let Some(()) = python_ready() else { return };
    let bytes = preset_with_weights_as(Preset::TinyQwen3Moe, ty);
    let path = scratch_dir().join(format!("weights-{}-{}.gguf", ty.name(), std::process::id()));
    std::fs::write(&path, &bytes).expect("write the model");
    let file = Arc::new(GgufFile::from_bytes(bytes).expect("the model opens"));
    let expert = file
        .tensors()
        .iter()
        .find(|t| t.name == "blk.0.ffn_down_exps.weight")
        .expect("an expert stack");
    assert_eq!(expert.ggml_type, ty, "the experts are stored as {ty}");

    let tok = Tokenizer::from_gguf(&file).unwrap();
    let mut tokens = tok.encode(
        "hello world, the quick brown fox jumps over 12 lazy dogs",
        tok.vocab().bos.is_some(),
    );
    tokens.truncate(24);
    let (want, vocab) = reference_logits(&path, &tokens, &scratch_dir());
    std::fs::remove_file(&path).ok();
    check_cpu_logits(ty.name(), &file, &tokens, &want, vocab);
}

#[test]
fn q2_k_weights_match_the_reference() {
    check(GgmlType::Q2K);
}

#[test]
fn q3_k_weights_match_the_reference() {
    check(GgmlType::Q3K);
}

#[test]
fn iq4_nl_weights_match_the_reference() {
    check(GgmlType::Iq4Nl);
}

#[test]
fn iq4_xs_weights_match_the_reference() {
    check(GgmlType::Iq4Xs);
}
