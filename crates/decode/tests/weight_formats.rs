//! The weight formats that no synthetic preset stores (Q2_K, Q3_K, IQ4_NL, IQ4_XS), end to end
//! on the CPU against the numpy reference, which dequantizes with gguf-py: the tiny Qwen3 MoE
//! model with every weight that is not f32 (attention, routed experts, embeddings, output)
//! stored in the format, logits at every position at both precisions. The GPU backend runs the
//! same models in gpu_backend.rs.

mod common;

use common::*;
use decode::backend::cpu::CpuBackend;
use decode::backend::Precision;
use decode::context::ContextOptions;
use decode::gguf_loader::synth::Preset;
use decode::gguf_loader::{GgmlType, GgufFile};
use decode::session::Session;
use decode::tokenizer::Tokenizer;
use std::sync::Arc;
use test_support::tolerance::compare;

/// As synthetic_reference.rs: max |difference| <= TOL x max(1, RMS of the reference logits).
const EXACT_TOL: f32 = 1e-4;
const FAST_TOL: f32 = 2e-3;

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
    for (precision, tol) in [(Precision::Exact, EXACT_TOL), (Precision::Fast, FAST_TOL)] {
        let mut model = Session::load(
            &file,
            CpuBackend::new(precision),
            ContextOptions {
                context: 64,
                // Smaller than the sequence, so chunked prefill is exercised too.
                max_batch: 10,
                all_logits: true,
                sequences: 1,
                kv_blocks: None,
            },
        )
        .unwrap_or_else(|e| panic!("{ty}: {e}"));
        assert_eq!(model.spec().vocab, vocab);
        let got = model.forward_all_logits(&tokens).unwrap();
        let (max, rms) = compare(&got, &want);
        eprintln!("{ty} {precision:?}: max |diff| {max:.2e}, reference rms {rms:.3}");
        assert!(
            max <= tol * rms.max(1.0),
            "{ty} {precision:?}: max diff {max} > {tol} x max(rms {rms}, 1)"
        );
    }
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
