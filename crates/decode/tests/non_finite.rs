//! Non-finite logits end their sequence with an error that names the position and the first
//! op whose output is not finite (from a checked re-run of the step), on each generation
//! path: `generate` on a session (the CLI's run and chat), `generate_many`, and the engine
//! the server runs, where only the failing request ends.

mod common;

use common::{assert_finished, preset_bytes};
use decode::backend::cpu::CpuBackend;
use decode::backend::Precision;
use decode::context::{Context, ContextOptions};
use decode::engine::{Engine, Update};
use decode::gguf_loader::synth::Preset;
use decode::gguf_loader::GgufFile;
use decode::model::Model;
use decode::sampler::SamplerConfig;
use decode::scheduler::{Finish, Request};
use decode::session::Session;
use decode::DecodeError;
use std::sync::Arc;
use test_support::models::set_non_finite_row;

/// Prompts of four tokens to try, for one whose first new token is not in it.
fn prompts() -> impl Iterator<Item = Vec<u32>> {
    (0..64u32).map(|i| vec![5 + i, 17 + i, 29 + i, 41 + i])
}

fn options(sequences: usize) -> ContextOptions {
    ContextOptions {
        context: 64,
        max_batch: 16,
        all_logits: false,
        sequences,
        kv_blocks: None,
    }
}

/// Greedy tokens after `prompt` on `file`.
fn greedy(file: &Arc<GgufFile>, precision: Precision, prompt: &[u32], n: usize) -> Vec<u32> {
    sampled(file, precision, prompt, n, SamplerConfig::GREEDY)
}

fn sampled(
    file: &Arc<GgufFile>,
    precision: Precision,
    prompt: &[u32],
    n: usize,
    sampler: SamplerConfig,
) -> Vec<u32> {
    let mut s = Session::load(file, CpuBackend::new(precision), options(1)).expect("loads");
    let report = decode::generate::generate(&mut s, prompt, n, sampler, &|_| false, &mut |_| {});
    report.expect("the model generates").tokens
}

/// Tiny Qwen3 (its output projection is not the embedding) with `edit` applied.
fn model_with(edit: impl FnOnce(&mut Vec<u8>)) -> Arc<GgufFile> {
    let mut bytes = preset_bytes(Preset::TinyQwen3);
    edit(&mut bytes);
    Arc::new(GgufFile::from_bytes(bytes).expect("opens"))
}

/// A tiny model whose embedding of a prompt's first new token is NaN: the prefill is clean,
/// its token comes out, and the decode step that reads it fails. The model, the prompt and
/// that token.
struct NanAfterFirst {
    bad: Arc<GgufFile>,
    prompt: Vec<u32>,
    first: u32,
}

fn nan_after_first_token(precision: Precision) -> NanAfterFirst {
    nan_after_first_sampled(precision, SamplerConfig::GREEDY, &[])
}

/// The same for `sampler`'s first token, which is none of `avoid`.
fn nan_after_first_sampled(
    precision: Precision,
    sampler: SamplerConfig,
    avoid: &[u32],
) -> NanAfterFirst {
    let good = model_with(|_| {});
    let (prompt, first) = prompts()
        .map(|p| {
            let first = sampled(&good, precision, &p, 1, sampler)[0];
            (p, first)
        })
        .find(|(p, first)| !p.contains(first) && !avoid.contains(first))
        .expect("a prompt that does not hold its first new token");
    let bad = model_with(|b| set_non_finite_row(b, "token_embd.weight", first as usize, f32::NAN));
    NanAfterFirst { bad, prompt, first }
}

fn generate_on(
    file: &Arc<GgufFile>,
    precision: Precision,
    prompt: &[u32],
    sampler: SamplerConfig,
) -> (Vec<u32>, decode::Result<decode::generate::GenerationReport>) {
    let mut s = Session::load(file, CpuBackend::new(precision), options(1)).expect("loads");
    let mut streamed = Vec::new();
    let r = decode::generate::generate(&mut s, prompt, 8, sampler, &|_| false, &mut |t| {
        streamed.push(t)
    });
    (streamed, r)
}

/// Checks `e` is the non-finite error at `pos` whose culprit names `site`.
fn assert_names(e: &DecodeError, pos: usize, site: &str) {
    let text = e.to_string();
    assert!(
        matches!(e, DecodeError::NonFiniteLogits { pos: p, .. } if *p == pos),
        "{text}"
    );
    assert!(
        text.contains(&format!("not finite at position {pos}")) && text.contains(site),
        "{text}"
    );
    assert!(text.contains("re-download or re-convert"), "{text}");
}

#[test]
fn a_nan_embedding_ends_generation_naming_the_position_and_the_tensor() {
    for precision in [Precision::Fast, Precision::Exact] {
        let NanAfterFirst { bad, prompt, first } = nan_after_first_token(precision);
        let (streamed, r) = generate_on(&bad, precision, &prompt, SamplerConfig::GREEDY);
        assert_eq!(
            streamed,
            vec![first],
            "{precision:?}: the clean prefill's token"
        );
        let e = r.expect_err("NaN logits are an error, not tokens");
        // The failing step is the decode of `first` at the position after the prompt.
        let site = "first non-finite output at tensor token_embd.weight";
        assert_names(&e, prompt.len(), site);
        assert!(
            matches!(e, DecodeError::NonFiniteLogits { token, .. } if token == first),
            "{e}"
        );
    }
}

#[test]
fn a_sampled_row_and_an_infinite_weight_deep_in_the_model_are_caught_too() {
    // A sampled row with penalties (the sampler the host runs), its seed's first token's
    // embedding NaN.
    let sampler = SamplerConfig {
        temperature: 0.8,
        repeat_penalty: 1.1,
        seed: 3,
        ..SamplerConfig::default()
    };
    let NanAfterFirst { bad, prompt, first } =
        nan_after_first_sampled(Precision::Fast, sampler, &[]);
    let (streamed, r) = generate_on(&bad, Precision::Fast, &prompt, sampler);
    assert_eq!(streamed, vec![first]);
    let e = r.expect_err("NaN logits");
    assert_names(&e, prompt.len(), "token_embd.weight");

    // One output row of layer 1's down projection is infinite: the prefill fails, and the
    // re-run points past everything before it.
    let inf = model_with(|b| set_non_finite_row(b, "blk.1.ffn_down.weight", 3, f32::INFINITY));
    for precision in [Precision::Fast, Precision::Exact] {
        let (streamed, r) = generate_on(&inf, precision, &prompt, SamplerConfig::GREEDY);
        assert!(streamed.is_empty(), "{precision:?}: {streamed:?}");
        let e = r.expect_err("infinite logits");
        let site = "layer 1, tensor blk.1.ffn_down.weight";
        assert_names(&e, prompt.len() - 1, site);
    }

    // A NaN output norm: the last op before the logits.
    let norm = model_with(|b| set_non_finite_row(b, "output_norm.weight", 0, f32::NAN));
    let (_, r) = generate_on(&norm, Precision::Fast, &prompt, SamplerConfig::GREEDY);
    let e = r.expect_err("NaN logits");
    assert_names(&e, prompt.len() - 1, "tensor output_norm.weight");
}

#[test]
fn generate_many_ends_with_the_error() {
    let NanAfterFirst { bad, prompt, .. } = nan_after_first_token(Precision::Fast);
    let mut be = CpuBackend::new(Precision::Fast);
    let model = Model::load(&bad, &mut be).expect("loads");
    let mut ctx = Context::new(&model, &mut be, options(2)).expect("context");
    let requests: Vec<_> = [prompt.clone(), vec![2, 3]]
        .into_iter()
        .map(|prompt| decode::generate_many::Request {
            prompt,
            sampler: SamplerConfig::GREEDY,
            max_new: 6,
            stop: decode::generate_many::Stop::Tokens(Vec::new()),
        })
        .collect();
    let e =
        decode::generate_many::generate_many(&model, &mut be, &mut ctx, &requests, &mut |_, _| {})
            .expect_err("request 0's logits are NaN");
    assert_names(&e, prompt.len(), "token_embd.weight");
}

/// In the engine (the server's), the failing request ends with the error and a request in
/// the same steps gets every token it gets alone; the engine then serves the next one.
#[test]
fn in_the_engine_only_the_failing_request_ends() {
    let precision = Precision::Fast;
    // A greedy request beside one whose sampler's first token (none of the greedy one's)
    // has a NaN embedding.
    let clean = vec![60, 7];
    let clean_alone = greedy(&model_with(|_| {}), precision, &clean, 6);
    let sampler = SamplerConfig {
        temperature: 1.0,
        seed: 7,
        ..SamplerConfig::default()
    };
    let avoid: Vec<u32> = clean.iter().chain(&clean_alone).copied().collect();
    let NanAfterFirst { bad, prompt, first } = nan_after_first_sampled(precision, sampler, &avoid);
    assert_eq!(greedy(&bad, precision, &clean, 6), clean_alone);

    let mut be = CpuBackend::new(precision);
    let model = Model::load(&bad, &mut be).expect("loads");
    let ctx = Context::new(&model, &mut be, options(2)).expect("context");
    let engine = Engine::start(model, be, ctx).expect("engine");
    let request = |prompt: &[u32], sampler| Request {
        prompt: prompt.to_vec(),
        sampler,
        max_new: 6,
        stop: Vec::new(),
    };
    // Submitted together, so they share steps: the decode step that fails is the other's
    // too.
    let failing = engine.submit(request(&prompt, sampler)).expect("submits");
    let good = engine
        .submit(request(&clean, SamplerConfig::GREEDY))
        .expect("submits");
    let (tokens, end) = failing.collect();
    assert_eq!(tokens, vec![first]);
    let Update::Failed(why) = end else {
        panic!("ended with {end:?}, not the error")
    };
    assert!(
        why.contains(&format!("not finite at position {}", prompt.len()))
            && why.contains("token_embd.weight"),
        "{why}"
    );
    let (tokens, end) = good.collect();
    assert_eq!(tokens, clean_alone, "the request beside the failing one");
    assert_finished(&end, Finish::TokenLimit);
    // The engine goes on, and the failed request's blocks are back.
    let next = engine.submit(request(&clean, SamplerConfig::GREEDY));
    let (tokens, _) = next.expect("submits").collect();
    assert_eq!(tokens, clean_alone);
    assert_eq!(engine.stats().expect("stats").pool.in_use, 0);
}
