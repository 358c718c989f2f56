//! The generation loop on a tiny synthetic model: prefill and step-by-step decode agree, stop
//! conditions, seeded sampling, and the KV cache bound.

mod common;

use common::scratch_dir;
use decode::backend::cpu::CpuBackend;
use decode::backend::Precision;
use decode::context::ContextOptions;
use decode::generate::{generate, StopReason};
use decode::gguf_loader::synth::{write_preset, Preset};
use decode::sampler::SamplerConfig;
use decode::session::Session;
use decode::DecodeError;
use test_support::tolerance::max_abs_diff;

fn tiny(preset: Preset, tag: &str, options: ContextOptions) -> Session<CpuBackend> {
    let path = scratch_dir().join(format!("gen-{tag}-{}.gguf", std::process::id()));
    write_preset(preset, &path, 3).unwrap();
    let file = decode::open_model(&path).unwrap();
    let model = Session::load(&file, CpuBackend::new(Precision::Exact), options).unwrap();
    std::fs::remove_file(&path).ok();
    model
}

fn opts(context: usize, all_logits: bool) -> ContextOptions {
    ContextOptions {
        context,
        max_batch: 16,
        all_logits,
        sequences: 1,
        kv_blocks: None,
    }
}

#[test]
fn decoding_one_token_at_a_time_matches_the_batched_prefill() {
    for preset in [Preset::TinyGemma3, Preset::TinyQwen3Moe, Preset::TinyLlama] {
        let mut model = tiny(preset, preset.name(), opts(64, true));
        // 40 tokens: past tiny-gemma3's sliding window (8) plus a batch, so its ring-buffered
        // window layers wrap.
        let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 300).collect();
        let batched = model.forward_all_logits(&tokens).unwrap();
        model.reset();
        let vocab = model.spec().vocab;
        let mut row = Vec::new();
        for (t, &tok) in tokens.iter().enumerate() {
            model.decode(tok).unwrap();
            model.last_logits(&mut row).unwrap();
            let want = &batched[t * vocab..(t + 1) * vocab];
            let max = max_abs_diff(&row, want);
            assert!(max < 1e-4, "{} position {t}: {max}", preset.name());
        }
        assert_eq!(model.position(), tokens.len());
    }
}

#[test]
fn sliding_window_layers_keep_only_a_window_of_keys() {
    let model = tiny(Preset::TinyGemma3, "ring", opts(64, false));
    let s = model.spec();
    let per_slot = (2 * s.n_head_kv * s.head_dim_k * 4) as u64;
    let windowed = s.layers.iter().filter(|l| l.window.is_some()).count() as u64;
    let window = s.layers.iter().find_map(|l| l.window).unwrap() as u64;
    assert!(windowed > 0 && window + 15 < 64);
    let full = s.n_layers as u64 - windowed;
    // Full layers hold 64 positions; window layers window + max_batch - 1, in whole KV blocks.
    let block = decode::kv::block_positions() as u64;
    let ring = (window + 15).next_multiple_of(block);
    assert!(ring < 64, "the ring is smaller than the context");
    let want = per_slot * (full * 64 + windowed * ring);
    assert_eq!(model.memory().get(decode::MemoryTag::KvCache), want);
}

#[test]
fn generation_stops_at_a_stop_token_and_at_the_limit() {
    let mut model = tiny(Preset::TinyQwen3, "stop", opts(64, false));
    let prompt = [1u32, 2, 3];
    let greedy = SamplerConfig::default();
    let all = generate(&mut model, &prompt, 8, greedy, &|_| false, &mut |_| {}).unwrap();
    assert_eq!(all.tokens.len(), 8);
    assert_eq!(all.stop, StopReason::TokenLimit);
    // Treat the third generated token as end-of-sequence: generation ends right there.
    let stop_id = all.tokens[2];
    model.reset();
    let mut streamed = Vec::new();
    let r = generate(
        &mut model,
        &prompt,
        8,
        greedy,
        &|id| id == stop_id,
        &mut |id| streamed.push(id),
    )
    .unwrap();
    let first = all.tokens.iter().position(|&t| t == stop_id).unwrap();
    assert_eq!(r.tokens, all.tokens[..=first]);
    assert_eq!(streamed, r.tokens, "every token is streamed as it comes");
    assert_eq!(r.stop, StopReason::EndOfSequence);
}

#[test]
fn seeded_sampling_repeats_and_the_context_bound_is_enforced() {
    let mut model = tiny(Preset::TinyGemma3, "seed", opts(12, false));
    let cfg = SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: 11,
        ..SamplerConfig::default()
    };
    let prompt = [2u32, 10, 20, 30];
    let a = generate(&mut model, &prompt, 6, cfg, &|_| false, &mut |_| {}).unwrap();
    model.reset();
    let b = generate(&mut model, &prompt, 6, cfg, &|_| false, &mut |_| {}).unwrap();
    assert_eq!(a.tokens, b.tokens);
    // 4 prompt tokens and 8 generated ones fed back fill the 12-position cache; a 9th comes
    // from the last logits, and generation ends at the bound instead of failing.
    model.reset();
    let c = generate(&mut model, &prompt, 100, cfg, &|_| false, &mut |_| {}).unwrap();
    assert_eq!(c.stop, StopReason::ContextFull);
    assert_eq!(c.tokens.len(), 9);
    assert_eq!(model.position(), 12);
    // A prompt longer than the cache is a typed error, not a panic.
    model.reset();
    let long: Vec<u32> = (0..13).collect();
    match model.forward(&long) {
        Err(DecodeError::ContextFull { needed, capacity }) => {
            assert_eq!((needed, capacity), (13, 12));
        }
        other => panic!("expected ContextFull, got {other:?}"),
    }
}

#[test]
fn out_of_vocabulary_tokens_are_rejected() {
    let mut model = tiny(Preset::TinyLlama, "oov", opts(16, false));
    let vocab = model.spec().vocab as u32;
    match model.decode(vocab) {
        Err(DecodeError::TokenOutOfRange { id, .. }) => assert_eq!(id, vocab),
        other => panic!("expected TokenOutOfRange, got {other:?}"),
    }
}

#[test]
fn penalties_steer_greedy_generation_away_from_seen_tokens() {
    let mut model = tiny(Preset::TinyQwen3, "penalties", opts(64, false));
    let prompt = [1u32, 2, 3];
    let never = |_: u32| false;
    let plain = SamplerConfig::default();
    let all = generate(&mut model, &prompt, 24, plain, &never, &mut |_| {}).unwrap();
    let repeats = |tokens: &[u32]| {
        let mut seen = std::collections::HashSet::new();
        tokens.iter().filter(|t| !seen.insert(**t)).count()
    };
    assert!(
        repeats(&all.tokens) > 0,
        "greedy repeats itself here: {:?}",
        all.tokens
    );
    model.reset();
    let penalized = SamplerConfig {
        repeat_penalty: 1000.0,
        presence_penalty: 2.0,
        ..plain
    };
    let varied = generate(&mut model, &prompt, 24, penalized, &never, &mut |_| {}).unwrap();
    // Every token seen (the prompt's too) is pushed below the unseen ones.
    let mut with_prompt = prompt.to_vec();
    with_prompt.extend(&varied.tokens);
    assert_eq!(repeats(&with_prompt), 0, "{:?}", varied.tokens);
}
