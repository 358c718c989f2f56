//! The real models, Gemma 3 270M (Q4_K_M, SentencePiece) and SmolLM2-135M-Instruct (Llama,
//! Q4_1, byte-level BPE), against the independent numpy reference (`tests/reference/`): logits
//! at every position of several prompts, greedy continuations, and Gemma's tokenization
//! (SmolLM2's pre-tokenizer is checked against llama.cpp's own cases in vocab_cases.rs).

mod common;

use common::*;
use decode::backend::cpu::CpuBackend;
use decode::backend::Precision;
use decode::context::ContextOptions;
use decode::session::Session;
use decode::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use test_support::models::{gemma_path, smollm2_path};
use test_support::tolerance::compare;

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:",
    "Once upon a time, in a land far away, there lived a",
];

/// Logit tolerance: the largest absolute difference over all positions and the whole vocabulary
/// may be at most this fraction of max(1, RMS of the reference logits over the same rows).
/// Exact path (f32 activations): only summation order differs from numpy.
const EXACT_TOL: f32 = 1e-4;
/// Fast path (activations quantized to 16 bits per block of 32 before every weight product).
const FAST_TOL: f32 = 2e-3;

fn load(path: &Path, precision: Precision, all_logits: bool) -> Session<CpuBackend> {
    let file = decode::open_model(path).expect("open the model");
    Session::load(
        &file,
        CpuBackend::new(precision),
        ContextOptions {
            context: 256,
            max_batch: 32,
            all_logits,
            sequences: 1,
            kv_blocks: None,
        },
    )
    .expect("load the model")
}

/// Logits of every prompt at every position, on both CPU precisions.
fn check_logits(path: Option<PathBuf>) {
    let Some(path) = path else { return };
    let Some(()) = python_ready() else { return };
    let file = decode::open_model(&path).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let mut exact = load(&path, Precision::Exact, true);
    let mut fast = load(&path, Precision::Fast, true);
    for prompt in PROMPTS {
        let ids = tok.encode(prompt, true);
        let (want, vocab) = reference_logits(&path, &ids, &scratch_dir());
        assert_eq!(vocab, exact.spec().vocab);
        for (model, tol, name) in [
            (&mut exact, EXACT_TOL, "exact"),
            (&mut fast, FAST_TOL, "fast"),
        ] {
            model.reset();
            let got = model.forward_all_logits(&ids).unwrap();
            let (max, rms) = compare(&got, &want);
            eprintln!(
                "{name} {prompt:?}: max |diff| {max:.5}, reference rms {rms:.3}, ratio {:.5}",
                max / rms
            );
            assert!(
                max <= tol * rms.max(1.0),
                "{name} path on {prompt:?}: max diff {max} > {tol} x max(rms {rms}, 1)"
            );
            // The top token agrees at every position.
            for t in 0..ids.len() {
                let row = |v: &[f32]| {
                    rocm_kernels::reference::sampling::argmax(&v[t * vocab..(t + 1) * vocab]) as u32
                };
                assert_eq!(
                    row(&got),
                    row(&want),
                    "{name} {prompt:?}: argmax differs at position {t}"
                );
            }
        }
    }
}

#[test]
fn gemma_logits_match_the_reference_at_every_position() {
    check_logits(gemma_path());
}

#[test]
fn smollm2_logits_match_the_reference_at_every_position() {
    check_logits(smollm2_path());
}

/// Greedy continuations of the first two prompts on the CPU's fast path: the same 16 tokens.
fn check_greedy(path: Option<PathBuf>) {
    let Some(path) = path else { return };
    let Some(()) = python_ready() else { return };
    let file = decode::open_model(&path).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let mut model = load(&path, Precision::Fast, false);
    for prompt in &PROMPTS[..2] {
        let ids = tok.encode(prompt, true);
        let want = reference_greedy(&path, &ids, 16);
        model.reset();
        let report = decode::generate::generate(
            &mut model,
            &ids,
            16,
            Default::default(),
            &|id| Some(id) == tok.vocab().eos,
            &mut |_| {},
        )
        .unwrap();
        eprintln!("{prompt:?} -> {:?}", tok.decode(&report.tokens));
        assert_eq!(report.tokens, want, "greedy continuation of {prompt:?}");
    }
}

#[test]
fn gemma_greedy_continuations_match_the_reference_for_16_tokens() {
    check_greedy(gemma_path());
}

#[test]
fn smollm2_greedy_continuations_match_the_reference_for_16_tokens() {
    check_greedy(smollm2_path());
}

#[test]
fn gemma_tokenizer_matches_sentencepiece_and_round_trips() {
    let Some(path) = gemma_path() else { return };
    let Some(()) = python_ready() else { return };
    let file = decode::open_model(&path).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let texts = [
        "Hello, world!",
        "  leading spaces and trailing  ",
        "Ünïcödé, 日本語のテキスト, emoji 🦀 and numbers 12345.",
        "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
        "tabs\tand\nnewlines\n\n\nend",
        "fn main() { println!(\"{}\", x.len()); }",
    ];
    for text in texts {
        let want = reference_tokenize(&path, text);
        let got = tok.encode(text, false);
        assert_eq!(got, want, "ids of {text:?}");
        assert_eq!(tok.decode(&got), text, "round trip of {text:?}");
    }
    assert_eq!(tok.encode("x", true)[0], tok.vocab().bos.unwrap());
}
