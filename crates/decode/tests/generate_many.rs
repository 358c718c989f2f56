//! `generate_many`: several requests through one context of N sequences give each request the
//! tokens `generate` gives it run alone on a one-sequence session, with the same settings;
//! more requests than sequences take turns in the freed slots. On the CPU's exact path a row's
//! logits are bitwise the same whatever else shares its step. Real Gemma 3 270M runs 8
//! requests of 16 tokens. A prompt whose prefix an earlier request computed skips that
//! prefill (the prefix cache) and still gets its tokens. On a GPU's exact path, a context of
//! one and of three sequences runs generate_many as generate runs.

mod common;

use common::preset_file;
use decode::backend::cpu::CpuBackend;
use decode::backend::gpu::{GpuBackend, KvType, MatvecPath};
use decode::backend::{Backend, Precision};
use decode::batch::{BatchRow, RowKind, RowOutput, StepBatch};
use decode::context::{Context, ContextOptions};
use decode::generate::{generate, StopReason};
use decode::generate_many::{generate_many, ManyReport, Request, Stop};
use decode::gguf_loader::synth::Preset;
use decode::model::{Model, ModelSpec};
use decode::sampler::SamplerConfig;
use decode::session::Session;
use decode::{DecodeError, GgufFile};
use std::sync::Arc;

fn options(context: usize, max_batch: usize, sequences: usize) -> ContextOptions {
    ContextOptions {
        context,
        max_batch,
        all_logits: false,
        sequences,
        kv_blocks: None,
    }
}

fn sampled(seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature: 0.9,
        top_k: 30,
        top_p: 0.9,
        seed,
        ..SamplerConfig::default()
    }
}

/// `n` requests with prompts of 1 to 19 tokens and limits of 1 to 12 tokens, greedy and
/// sampled in turn, each sampled one with its own seed.
fn requests(n: usize, vocab: u32) -> Vec<Request> {
    (0..n)
        .map(|i| {
            let len = 1 + (i * 7) % 19;
            Request {
                prompt: (0..len as u32)
                    .map(|j| (j * 31 + i as u32 * 17 + 1) % vocab)
                    .collect(),
                sampler: if i % 2 == 0 {
                    SamplerConfig::default()
                } else {
                    sampled(100 + i as u64)
                },
                max_new: 1 + (i * 5) % 12,
                stop: Stop::Tokens(Vec::new()),
            }
        })
        .collect()
}

/// What `generate` gives `r` alone, on a fresh sequence of a one-sequence session.
fn alone<B: Backend>(s: &mut Session<B>, r: &Request) -> (Vec<u32>, StopReason) {
    s.reset();
    let stop = r.stop.clone();
    let is_stop = move |t: u32| match &stop {
        Stop::Tokens(ids) => ids.contains(&t),
        Stop::When(f) => f(t),
    };
    let rep = generate(s, &r.prompt, r.max_new, r.sampler, &is_stop, &mut |_| {}).expect("alone");
    (rep.tokens, rep.stop)
}

/// Runs `reqs` through a context of `opts` and checks every request against its run alone,
/// the callback's tokens against the report's, and that the slots were all used.
fn check_against_alone<B: Backend>(
    what: &str,
    file: &Arc<GgufFile>,
    backend: impl Fn() -> B,
    opts: ContextOptions,
    reqs: &[Request],
) -> ManyReport {
    let mut be = backend();
    let model = Model::load(file, &mut be).expect("load");
    let mut ctx = Context::new(&model, &mut be, opts).expect("context");
    let mut streamed: Vec<Vec<u32>> = vec![Vec::new(); reqs.len()];
    let report = generate_many(&model, &mut be, &mut ctx, reqs, &mut |i, t| {
        streamed[i].push(t)
    })
    .unwrap_or_else(|e| panic!("{what}: generate_many failed: {e}"));
    assert_eq!(report.requests.len(), reqs.len(), "{what}");
    let mut single = Session::load(file, backend(), options(opts.context, opts.max_batch, 1))
        .expect("a one-sequence session");
    for (i, (r, got)) in reqs.iter().zip(&report.requests).enumerate() {
        let (tokens, stop) = alone(&mut single, r);
        assert_eq!(
            got.tokens,
            tokens,
            "{what}: request {i} (prompt {}, limit {}, {:?}) differs from generate alone",
            r.prompt.len(),
            r.max_new,
            r.sampler
        );
        assert_eq!(got.stop, stop, "{what}: request {i}'s stop reason");
        assert_eq!(streamed[i], got.tokens, "{what}: request {i}'s callback");
        assert_eq!(got.prompt_tokens, r.prompt.len());
        if r.max_new > 0 {
            assert!(got.seq.is_some_and(|s| s < opts.sequences), "{what}: {i}");
        }
    }
    assert!(report.steps > 0 || reqs.iter().all(|r| r.max_new == 0));
    report
}

#[test]
fn every_request_gets_the_tokens_it_gets_alone_on_every_tiny_model() {
    for preset in Preset::ALL.into_iter().filter(|p| p.is_tiny()) {
        let name = preset.name();
        let file = Arc::new(preset_file(preset));
        let vocab = ModelSpec::from_gguf(&file).expect("spec").vocab as u32;
        let exact = || CpuBackend::new(Precision::Exact);
        // (requests, sequences, max_batch): one alone; three in three sequences; eight in
        // three (they wait their turn); eight in eight with fewer rows per step than
        // sequences, so decode rows take turns too.
        for (n, seqs, mb) in [(1, 1, 16), (3, 3, 16), (8, 3, 8), (8, 8, 5)] {
            let reqs = requests(n, vocab);
            let what = format!("{name}: {n} requests in {seqs} sequences of {mb} rows");
            let report = check_against_alone(&what, &file, exact, options(48, mb, seqs), &reqs);
            if n > seqs {
                let seqs_used: std::collections::BTreeSet<_> =
                    report.requests.iter().filter_map(|r| r.seq).collect();
                assert_eq!(seqs_used.len(), seqs, "{what}: every slot is reused");
            }
        }
    }
}

#[test]
fn stop_tokens_the_context_s_end_and_empty_requests_end_as_generate_ends_them() {
    let file = Arc::new(preset_file(Preset::TinyQwen3));
    let exact = || CpuBackend::new(Precision::Exact);
    let mut single = Session::load(&file, exact(), options(32, 8, 1)).expect("session");
    let base = Request {
        prompt: vec![3, 1, 4, 1, 5],
        // Sampled: greedy on a tiny random model repeats one token.
        sampler: sampled(3),
        max_new: 10,
        stop: Stop::Tokens(Vec::new()),
    };
    // The first generated token unlike those before it, made a stop token: the request ends
    // right there.
    let free = alone(&mut single, &base).0;
    let at = (1..free.len())
        .find(|&k| !free[..k].contains(&free[k]))
        .expect("a sampled run of 10 tokens that is not one token repeated");
    let stop_id = free[at];
    let reqs = vec![
        Request {
            stop: Stop::Tokens(vec![stop_id]),
            ..base.clone()
        },
        Request {
            stop: Stop::When(Arc::new(move |t| t == stop_id)),
            ..base.clone()
        },
        // 30 of 32 positions taken by the prompt: three tokens, then the context is full.
        Request {
            prompt: (0..30).map(|i| (i * 3 + 2) % 200).collect(),
            max_new: 10,
            ..base.clone()
        },
        Request {
            max_new: 0,
            ..base.clone()
        },
        base.clone(),
    ];
    let report = check_against_alone("stops", &file, exact, options(32, 8, 2), &reqs);
    let stops: Vec<StopReason> = report.requests.iter().map(|r| r.stop).collect();
    assert_eq!(stops[0], StopReason::EndOfSequence);
    assert_eq!(report.requests[0].tokens.len(), at + 1);
    assert_eq!(stops[2], StopReason::ContextFull);
    assert_eq!(report.requests[2].tokens.len(), 3);
    assert_eq!(
        (stops[3], report.requests[3].seq),
        (StopReason::TokenLimit, None)
    );
    assert!(report.requests[3].tokens.is_empty());
    assert_eq!(stops[4], StopReason::TokenLimit);
}

#[test]
fn bad_requests_are_refused_by_name_before_any_step() {
    let file = Arc::new(preset_file(Preset::TinyLlama));
    let mut be = CpuBackend::new(Precision::Exact);
    let model = Model::load(&file, &mut be).expect("load");
    let vocab = model.spec().vocab as u32;
    let mut ctx = Context::new(&model, &mut be, options(16, 8, 2)).expect("context");
    let good = Request {
        prompt: vec![1, 2, 3],
        sampler: SamplerConfig::default(),
        max_new: 4,
        stop: Stop::Tokens(Vec::new()),
    };
    let cases = [
        (
            Request {
                prompt: Vec::new(),
                ..good.clone()
            },
            "request 1: the prompt is empty",
        ),
        (
            Request {
                sampler: SamplerConfig {
                    temperature: -1.0,
                    ..SamplerConfig::default()
                },
                ..good.clone()
            },
            "request 1: --temp must be",
        ),
        (
            Request {
                prompt: vec![1, vocab],
                ..good.clone()
            },
            "outside the vocabulary",
        ),
        (
            Request {
                prompt: vec![1; 17],
                ..good.clone()
            },
            "prompt of 17 tokens does not fit",
        ),
    ];
    for (bad, needle) in cases {
        let reqs = [good.clone(), bad];
        let e = generate_many(&model, &mut be, &mut ctx, &reqs, &mut |_, _| {}).unwrap_err();
        assert!(matches!(e, DecodeError::InvalidArgument(_)), "{e:?}");
        let e = e.to_string();
        assert!(e.contains(needle), "{e:?} does not say {needle:?}");
        assert_eq!(
            (ctx.len(0), ctx.len(1)),
            (0, 0),
            "a refused call ran a step"
        );
    }
    let none = generate_many(&model, &mut be, &mut ctx, &[], &mut |_, _| {}).expect("no requests");
    assert!(none.requests.is_empty() && none.steps == 0);
}

/// One row's logits as bits.
fn bits<B: Backend>(ctx: &Context<B>, be: &mut B, row: usize) -> Vec<u32> {
    let mut out = Vec::new();
    ctx.read_logits(be, row, &mut out).expect("logits");
    out.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn a_row_s_logits_are_bitwise_the_same_whatever_shares_its_step() {
    const TARGET: usize = 2;
    for preset in Preset::ALL.into_iter().filter(|p| p.is_tiny()) {
        let name = preset.name();
        let file = Arc::new(preset_file(preset));
        let mut be = CpuBackend::new(Precision::Exact);
        let model = Model::load(&file, &mut be).expect("load");
        let vocab = model.spec().vocab as u32;
        let prompt: Vec<u32> = (0..11).map(|i| (i * 13 + 7) % vocab).collect();
        let fed: Vec<u32> = (0..5).map(|i| (i * 29 + 3) % vocab).collect();
        // Alone: the whole prompt in one chunk, then one decode row per step.
        let mut want = Vec::new();
        let mut one = Context::new(&model, &mut be, options(40, 16, 1)).expect("context");
        let b = StepBatch::prefill(0, 0, &prompt, RowOutput::Logits);
        model.step(&mut be, &mut one, &b).expect("prompt");
        want.push(bits(&one, &mut be, prompt.len() - 1));
        for (i, &t) in fed.iter().enumerate() {
            let b = StepBatch::decode(0, prompt.len() + i, t, RowOutput::Logits);
            model.step(&mut be, &mut one, &b).expect("decode");
            want.push(bits(&one, &mut be, 0));
        }

        // In a batch: the target (sequence 2) splits its prompt over two steps beside other
        // sequences' chunks and decode rows, then decodes at the start, middle and end of
        // steps of one to four rows.
        let mut ctx = Context::new(&model, &mut be, options(40, 16, 4)).expect("context");
        let other = |s: usize, n: usize| -> Vec<u32> {
            (0..n as u32)
                .map(|j| (j * 5 + s as u32 * 41 + 2) % vocab)
                .collect()
        };
        let mut b = StepBatch::new();
        b.push_prefill(0, 0, &other(0, 6), RowOutput::Logits);
        b.push_prefill(TARGET, 0, &prompt[..4], RowOutput::Nothing);
        b.push_prefill(1, 0, &other(1, 3), RowOutput::Logits);
        model.step(&mut be, &mut ctx, &b).expect("step 1");
        let dec = |seq: usize, pos: usize, token: u32| BatchRow {
            seq,
            pos,
            token,
            kind: RowKind::Decode,
            output: RowOutput::Logits,
        };
        let mut b = StepBatch::new();
        b.push(dec(0, 6, 9 % vocab));
        b.push(dec(1, 3, 4 % vocab));
        b.push_prefill(TARGET, 4, &prompt[4..], RowOutput::Logits);
        b.push_prefill(3, 0, &other(3, 2), RowOutput::Logits);
        model.step(&mut be, &mut ctx, &b).expect("step 2");
        assert_eq!(
            bits(&ctx, &mut be, 2 + prompt.len() - 4 - 1),
            want[0],
            "{name}: the prompt's last row split over two mixed steps"
        );
        let mut pos = [7, 4, prompt.len(), 2];
        // Per decode step: the other sequences in it and the target's row among them (alone,
        // first, in the middle, last of four, first of four).
        let layouts: [(&[usize], usize); 5] = [
            (&[], 0),
            (&[1], 0),
            (&[0, 3], 1),
            (&[0, 1, 3], 3),
            (&[3, 1, 0], 0),
        ];
        assert_eq!(layouts.len(), fed.len());
        for (i, (&t, &(others, at))) in fed.iter().zip(&layouts).enumerate() {
            let mut seqs = others.to_vec();
            seqs.insert(at, TARGET);
            let mut b = StepBatch::new();
            for &s in &seqs {
                let token = if s == TARGET {
                    t
                } else {
                    (s as u32 * 3 + i as u32) % vocab
                };
                b.push(dec(s, pos[s], token));
                pos[s] += 1;
            }
            model.step(&mut be, &mut ctx, &b).expect("decode step");
            assert_eq!(
                bits(&ctx, &mut be, at),
                want[i + 1],
                "{name}: decode {i}, the target at row {at} of {}",
                b.len()
            );
        }
    }
}

#[test]
fn real_gemma_runs_eight_requests_of_sixteen_tokens_as_each_runs_alone() {
    let Some(path) = test_support::models::gemma_path() else {
        return;
    };
    let file = decode::open_model(&path).expect("the Gemma file opens");
    // The fast path: the exact one took 140 s on two cores against 20 s. Its rows are as
    // independent of their neighbours (each row is quantized on its own), so the tokens must
    // still be equal to the single runs' on the same path.
    let fast = || CpuBackend::new(Precision::Fast);
    let reqs: Vec<Request> = (0..8)
        .map(|i| Request {
            prompt: std::iter::once(2)
                .chain((0..3 + i as u32).map(|j| 1000 + j * 97 + i as u32 * 31))
                .collect(),
            sampler: if i % 2 == 0 {
                SamplerConfig::default()
            } else {
                sampled(7 + i as u64)
            },
            max_new: 16,
            stop: Stop::Tokens(Vec::new()),
        })
        .collect();
    let report = check_against_alone("gemma3-270m", &file, fast, options(64, 32, 8), &reqs);
    assert_eq!(report.generated(), 8 * 16);
}

#[test]
fn a_cached_prefix_skips_its_prefill_and_keeps_the_tokens() {
    // One sequence, so the second request runs after the first has finished and left its
    // full blocks in the prefix cache; both share a 40-token prefix (two full blocks of 16).
    let file = Arc::new(preset_file(Preset::TinyLlama));
    let vocab = ModelSpec::from_gguf(&file).expect("spec").vocab as u32;
    let shared: Vec<u32> = (0..40).map(|j| (j * 13 + 5) % vocab).collect();
    let reqs: Vec<Request> = [vec![1, 2], vec![3, 4, 5]]
        .into_iter()
        .map(|tail| Request {
            prompt: shared.iter().copied().chain(tail).collect(),
            sampler: SamplerConfig::default(),
            max_new: 4,
            stop: Stop::Tokens(Vec::new()),
        })
        .collect();
    let exact = || CpuBackend::new(Precision::Exact);
    let report = check_against_alone("prefix", &file, exact, options(64, 16, 1), &reqs);
    // Without the cache: 42 + 43 prompt rows and 3 + 3 decode rows. The second prompt's first
    // 32 positions are found, so only its last 11 are computed.
    assert_eq!(report.rows, 42 + 3 + (43 - 32) + 3, "rows run");
}

/// Real Gemma 3 has sliding-window layers (a window of 512 in rings of `512 + max_batch - 1`
/// slots here): the second request goes on from the ring the first left, as far as its window
/// is still there, and its tokens are still its own.
#[test]
fn real_gemma_goes_on_from_the_ring_a_finished_request_left() {
    let Some(path) = test_support::models::gemma_path() else {
        return;
    };
    let file = decode::open_model(&path).expect("the Gemma file opens");
    let shared: Vec<u32> = std::iter::once(2)
        .chain((0..39).map(|j| 1000 + j * 97))
        .collect();
    let reqs: Vec<Request> = [vec![1, 2], vec![3, 4, 5]]
        .into_iter()
        .map(|tail| Request {
            prompt: shared.iter().copied().chain(tail).collect(),
            sampler: SamplerConfig::default(),
            max_new: 8,
            stop: Stop::Tokens(Vec::new()),
        })
        .collect();
    let opts = options(640, 32, 1);
    let fast = || CpuBackend::new(Precision::Fast);
    let report = check_against_alone("gemma3-270m ring", &file, fast, opts, &reqs);
    // The first wrote 49 positions; the second finds the first 32 (two blocks, 17 before the
    // ring's last write, within its 31 spare slots) and computes its last 11.
    assert_eq!(report.rows, 42 + 7 + (43 - 32) + 7, "rows run");
}

#[test]
fn on_the_gpu_one_and_three_sequences_run_as_generate() {
    let test = "on_the_gpu_one_and_three_sequences_run_as_generate";
    let _lock = test_support::gpu::gpu_lock();
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let file = Arc::new(preset_file(Preset::TinyLlama));
    let gpu = || {
        let mut be = GpuBackend::new(device, 16, true).expect("the GPU backend starts");
        be.set_matvec_path(MatvecPath::Exact);
        be.set_kv_type(KvType::F32);
        be
    };
    let vocab = ModelSpec::from_gguf(&file).expect("spec").vocab as u32;
    let reqs = requests(5, vocab);
    check_against_alone("gpu, one sequence", &file, gpu, options(48, 16, 1), &reqs);
    check_against_alone(
        "gpu, three sequences",
        &file,
        gpu,
        options(48, 16, 3),
        &reqs,
    );
}

/// Runs `reqs` through a context whose KV pool is `blocks` blocks shared by `sequences`
/// sequences of 48 positions: what it held of the pool in the backend's books before and after,
/// the blocks it backed, and each request's tokens.
fn run_shared_pool<B: Backend>(
    file: &Arc<GgufFile>,
    be: &mut B,
    blocks: Option<usize>,
    sequences: usize,
    reqs: &[Request],
) -> (u64, u64, usize, Vec<Vec<u32>>) {
    let model = Model::load(file, be).expect("load");
    let opts = ContextOptions {
        kv_blocks: blocks,
        ..options(48, 16, sequences)
    };
    let mut ctx = Context::new(&model, be, opts).expect("context");
    let before = be.memory().get(decode::memory::MemoryTag::KvCache);
    let backed_before = ctx.kv_backed_blocks();
    let report = generate_many(&model, be, &mut ctx, reqs, &mut |_, _| {}).expect("the run");
    let after = be.memory().get(decode::memory::MemoryTag::KvCache);
    assert!(
        ctx.kv_backed_blocks() >= backed_before,
        "backed blocks never shrink"
    );
    let tokens = report.requests.into_iter().map(|r| r.tokens).collect();
    (before, after, ctx.kv_backed_blocks(), tokens)
}

#[test]
fn a_shared_pool_is_backed_as_its_blocks_are_handed_out() {
    let file = Arc::new(preset_file(Preset::TinyLlama));
    let spec = ModelSpec::from_gguf(&file).expect("spec");
    let vocab = spec.vocab as u32;
    let reqs = requests(6, vocab);
    // Four sequences of 48 positions own 12 blocks of 16; a pool of 10 is shared.
    let mut be = CpuBackend::new(Precision::Exact);
    let (before, after, backed, shared) = run_shared_pool(&file, &mut be, Some(10), 4, &reqs);
    assert_eq!(
        before, 0,
        "a shared pool holds nothing before a block is handed out"
    );
    assert!(backed > 0 && backed <= 10, "{backed} blocks backed");
    // Every layer is in the pool on Llama: each backed block is 16 positions of keys and
    // values in f32 rows.
    let (kd, vd) = (
        spec.n_head_kv * spec.head_dim_k,
        spec.n_head_kv * spec.head_dim_v,
    );
    let per_block = (16 * (kd + vd) * 4 * spec.n_layers) as u64;
    assert_eq!(
        after,
        backed as u64 * per_block,
        "the books hold the backed blocks"
    );
    // The same tokens as contexts whose sequences own their blocks from the start.
    let mut whole = CpuBackend::new(Precision::Exact);
    let (owned, _, owned_backed, tokens) = run_shared_pool(&file, &mut whole, None, 4, &reqs);
    assert_eq!(
        owned,
        12 * per_block,
        "owned blocks are all backed at creation"
    );
    assert_eq!(owned_backed, 12);
    assert_eq!(shared, tokens);
}

#[test]
fn on_the_gpu_a_shared_pool_grows_in_mapped_pieces_and_keeps_the_tokens() {
    let test = "on_the_gpu_a_shared_pool_grows_in_mapped_pieces_and_keeps_the_tokens";
    let _lock = test_support::gpu::gpu_lock();
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let file = Arc::new(preset_file(Preset::TinyLlama));
    let vocab = ModelSpec::from_gguf(&file).expect("spec").vocab as u32;
    let reqs = requests(6, vocab);
    let gpu = || {
        let mut be = GpuBackend::new(device, 16, true).expect("the GPU backend starts");
        be.set_matvec_path(MatvecPath::Exact);
        be.set_kv_type(KvType::F32);
        be
    };
    let mut be = gpu();
    let grows = device.map_granularity().expect("the granularity query");
    eprintln!("{test}: mapping granularity {grows:?}");
    let (before, after, backed, shared) = run_shared_pool(&file, &mut be, Some(10), 4, &reqs);
    // The context is gone: its regions gave every piece back.
    let stats = be.allocator().stats();
    eprintln!(
        "{test}: kv before {before}, after {after}, {backed} blocks backed, {} mapped once the \
         context is dropped",
        stats.mapped_bytes
    );
    assert!(backed > 0 && backed <= 10, "{backed} blocks backed");
    if grows.is_some() {
        assert_eq!(before, 0, "nothing mapped before a block is handed out");
        assert!(after > 0, "the pool's pieces are booked under kv_cache");
        assert_eq!(stats.mapped_bytes, 0, "{stats:?}");
    }
    let mut whole = gpu();
    let (_, _, _, tokens) = run_shared_pool(&file, &mut whole, None, 4, &reqs);
    assert_eq!(
        shared, tokens,
        "the same tokens as sequences owning their blocks"
    );
}
