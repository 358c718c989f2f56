//! Tiny synthetic llama, qwen3, qwen3moe and gemma3 models (random quantized weights with the
//! real tensor layouts, written by gguf-loader's synth presets) against the numpy reference:
//! logits at every position, and tokenization.

mod common;

use common::*;
use decode::backend::cpu::CpuBackend;
use decode::backend::Precision;
use decode::gguf_loader::synth::{write_preset, Preset};
use decode::model::{Model, ModelOptions};
use decode::tokenizer::Tokenizer;
use std::path::PathBuf;

/// Logit tolerance: max |difference| <= TOL x max(1, RMS of the reference logits), as in
/// gemma_reference.rs.
const EXACT_TOL: f32 = 1e-4;
const FAST_TOL: f32 = 2e-3;

const TEXT: &str = "hello world, the quick brown fox jumps over 12 lazy dogs";

fn synth(preset: Preset) -> PathBuf {
    let path = scratch_dir().join(format!("{}-{}.gguf", preset.name(), std::process::id()));
    write_preset(preset, &path, 7).expect("write the synthetic model");
    path
}

fn check(preset: Preset) {
    let Some(()) = python_ready() else { return };
    let path = synth(preset);
    let file = decode::open_model(&path).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();

    // Tokenization agrees with the independent reference and round-trips, including the
    // pre-tokenizer's corners: digit runs, contractions, whitespace runs and newlines,
    // punctuation runs, non-Latin letters.
    for text in [
        TEXT,
        "It's 2026; they'RE 1234567 times   faster!!\n\n  ok\t(yes)",
        "naïve café — 日本語 and ελληνικά, x=3.14159",
        "  leading\r\n\r\ntrailing   ",
    ] {
        let ids = tok.encode(text, false);
        let want = reference_tokenize(&path, text);
        assert_eq!(ids, want, "{} ids of {text:?}", preset.name());
        assert_eq!(tok.decode(&ids), text);
    }

    // Logits at every position, both precisions. A BOS first when the vocabulary has one.
    let mut tokens = tok.encode(TEXT, tok.vocab().bos.is_some());
    tokens.truncate(24);
    let (want, vocab) = reference_logits(&path, &tokens, &scratch_dir());
    for (precision, tol) in [(Precision::Exact, EXACT_TOL), (Precision::Fast, FAST_TOL)] {
        let mut model = Model::load(
            &file,
            CpuBackend::new(precision),
            ModelOptions {
                context: 64,
                // Smaller than the sequence, so chunked prefill is exercised too.
                max_batch: 10,
                all_logits: true,
            },
        )
        .unwrap();
        assert_eq!(model.spec().vocab, vocab);
        let got = model.forward_all_logits(&tokens).unwrap();
        let (max, rms) = compare(&got, &want);
        eprintln!(
            "{} {precision:?}: max |diff| {max:.2e}, reference rms {rms:.3}",
            preset.name()
        );
        assert!(
            max <= tol * rms.max(1.0),
            "{} {precision:?}: max diff {max} > {tol} x max(rms {rms}, 1)",
            preset.name()
        );
    }
    std::fs::remove_file(&path).ok();
}

#[test]
fn tiny_llama_matches_the_reference() {
    check(Preset::TinyLlama);
}

#[test]
fn tiny_qwen3_matches_the_reference() {
    check(Preset::TinyQwen3);
}

#[test]
fn tiny_qwen3moe_matches_the_reference() {
    check(Preset::TinyQwen3Moe);
}

#[test]
fn tiny_gemma3_matches_the_reference() {
    check(Preset::TinyGemma3);
}
