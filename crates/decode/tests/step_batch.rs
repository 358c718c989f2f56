//! Several sequences in one step: a context of two sequences runs steps whose rows belong to
//! both, at different positions, mixing a prompt chunk with decode tokens, and every row's
//! logits and sampled token equal those of the sequence run alone on the same backend: on the
//! exact CPU path to summation order, on the GPU's exact path (f32 products and KV cache) to
//! the tolerance its conformance tests use, since a batched step may take another kernel (a
//! decode row inside a prefill step) or split attention's keys otherwise. On the GPU's int8
//! path the logits are held to that path's conformance tolerance (`selftest::INT8_TOL`) and
//! the sampled tokens are not compared: a batched step rounds its activations through other
//! kernels, and batched_runs.rs holds greedy tokens to the near-tie rule instead.

mod common;

use common::preset_file;
use decode::backend::cpu::CpuBackend;
use decode::backend::gpu::{GpuBackend, KvType, MatvecPath};
use decode::backend::{Backend, Precision};
use decode::batch::{BatchRow, RowKind, RowOutput, StepBatch};
use decode::context::{Context, ContextOptions};
use decode::gguf_loader::synth::Preset;
use decode::model::{Model, ModelSpec};
use decode::sampler::SamplerConfig;
use decode::session::Session;
use decode::GgufFile;
use std::sync::Arc;
use test_support::tolerance::max_abs_diff;

/// The exact CPU path runs each row's products and attention on their own, so a row's result
/// does not depend on its neighbours; what is left is summation order inside a kernel.
const TOL: f32 = 1e-4;

/// The GPU's exact path against itself: f32 throughout, with attention's reduction order the
/// only difference (gpu_backend's GPU_TOL against the CPU is larger).
const GPU_TOL: f32 = 1e-3;

const CONTEXT: usize = 64;

fn options(sequences: usize) -> ContextOptions {
    ContextOptions {
        context: CONTEXT,
        max_batch: 16,
        all_logits: false,
        sequences,
        kv_blocks: None,
    }
}

fn sampler(seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 20,
        top_p: 0.95,
        seed,
        ..SamplerConfig::default()
    }
}

/// What one sequence produces alone: the logits after its prompt and after each decode token
/// fed to it, and the tokens its sampler draws at each of those points.
struct Alone {
    logits: Vec<Vec<f32>>,
    sampled: Vec<u32>,
}

/// Runs `prompt` then `fed` one decode step at a time on a fresh one-sequence session, twice:
/// once for the logits, once for the tokens `config` draws (the stream starts at its seed).
fn alone<B: Backend>(
    file: &Arc<GgufFile>,
    backend: &impl Fn() -> B,
    prompt: &[u32],
    fed: &[u32],
    config: &SamplerConfig,
) -> Alone {
    let mut s = Session::load(file, backend(), options(1)).expect("load");
    let mut logits = Vec::new();
    let mut row = Vec::new();
    s.forward(prompt).expect("prompt");
    s.last_logits(&mut row).unwrap();
    logits.push(row.clone());
    for &t in fed {
        s.decode(t).expect("decode");
        s.last_logits(&mut row).unwrap();
        logits.push(row.clone());
    }
    let mut s = Session::load(file, backend(), options(1)).expect("load");
    let mut sampled = vec![s.prefill_and_sample(prompt, config).expect("prompt")];
    for &t in fed {
        sampled.push(s.decode_and_sample(t, config).expect("decode"));
    }
    Alone { logits, sampled }
}

fn row(seq: usize, pos: usize, token: u32, kind: RowKind, output: RowOutput) -> BatchRow {
    BatchRow {
        seq,
        pos,
        token,
        kind,
        output,
    }
}

fn check_row<B: Backend>(
    what: &str,
    ctx: &Context<B>,
    be: &mut B,
    batch_row: usize,
    want: &[f32],
    tol: f32,
) {
    let mut got = Vec::new();
    ctx.read_logits(be, batch_row, &mut got).expect("logits");
    let diff = max_abs_diff(&got, want);
    // In units of max(1, RMS), as the conformance tests state their tolerances.
    let scale = test_support::tolerance::rms(want).max(1.0);
    assert!(
        diff <= tol * scale,
        "{what}: logits differ by {diff} from the run alone (allowed {tol} x {scale})"
    );
}

#[test]
fn two_sequences_in_one_step_match_each_run_alone() {
    two_sequences_match_alone(&|| CpuBackend::new(Precision::Exact), TOL, Tokens::Equal);
}

#[test]
fn two_sequences_in_one_gpu_step_match_each_run_alone() {
    let test = "two_sequences_in_one_gpu_step_match_each_run_alone";
    let _lock = test_support::gpu::gpu_lock();
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let make = || {
        let mut be = GpuBackend::new(device, 16, true).expect("the GPU backend starts");
        be.set_matvec_path(MatvecPath::Exact);
        be.set_kv_type(KvType::F32);
        be
    };
    two_sequences_match_alone(&make, GPU_TOL, Tokens::Equal);
}

#[test]
fn two_sequences_in_one_gpu_step_on_the_int8_path_match_alone_within_its_tolerance() {
    let test = "two_sequences_in_one_gpu_step_on_the_int8_path_match_alone_within_its_tolerance";
    let _lock = test_support::gpu::gpu_lock();
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    // The defaults: int8 products and an f16 KV cache.
    let make = || GpuBackend::new(device, 16, true).expect("the GPU backend starts");
    two_sequences_match_alone(&make, decode::selftest::INT8_TOL, Tokens::Unchecked);
}

/// Whether the rows' sampled tokens must equal the runs alone.
#[derive(Clone, Copy, PartialEq)]
enum Tokens {
    Equal,
    Unchecked,
}

fn two_sequences_match_alone<B: Backend>(backend: &impl Fn() -> B, tol: f32, tokens: Tokens) {
    for preset in Preset::ALL.into_iter().filter(|p| p.is_tiny()) {
        let name = preset.name();
        let file = Arc::new(preset_file(preset));
        let vocab = ModelSpec::from_gguf(&file).expect("spec").vocab as u32;
        // Sequence 0: a 9-token prompt; sequence 1: a 3-token prompt, then 2 more prompt
        // tokens while sequence 0 decodes (a mixed step).
        let p0: Vec<u32> = (0..9).map(|i| (i * 7 + 3) % vocab).collect();
        let p1: Vec<u32> = (0..5).map(|i| (i * 5 + 1) % vocab).collect();
        let fed0: Vec<u32> = (0..4).map(|i| (i * 11 + 2) % vocab).collect();
        let fed1: Vec<u32> = (0..3).map(|i| (i * 13 + 4) % vocab).collect();
        let (c0, c1) = (sampler(7), sampler(8));
        let a0 = alone(&file, backend, &p0, &fed0, &c0);
        let a1 = alone(&file, backend, &p1, &fed1, &c1);

        let mut be = backend();
        let model = Model::load(&file, &mut be).expect("load");
        let mut ctx = Context::new(&model, &mut be, options(2)).expect("a two-sequence context");

        // Step 1: both prompts' first chunks, sequence 1's only partly.
        let mut batch = StepBatch::new();
        batch.push_prefill(0, 0, &p0, RowOutput::Sample(c0));
        batch.push_prefill(1, 0, &p1[..3], RowOutput::Nothing);
        let sampled = model.step(&mut be, &mut ctx, &batch).expect("step 1");
        check_row(
            &format!("{name} step 1 seq 0"),
            &ctx,
            &mut be,
            8,
            &a0.logits[0],
            tol,
        );
        assert_eq!(sampled.len(), 1);
        if tokens == Tokens::Equal {
            assert_eq!(
                (sampled[0].seq, sampled[0].token),
                (0, a0.sampled[0]),
                "{name}"
            );
        }
        assert_eq!((ctx.len(0), ctx.len(1)), (9, 3));

        // Step 2, mixed: sequence 0 decodes at 9 while sequence 1 finishes its prompt at 3..5.
        let mut batch = StepBatch::new();
        batch.push_prefill(1, 3, &p1[3..], RowOutput::Sample(c1));
        batch.push(row(0, 9, fed0[0], RowKind::Decode, RowOutput::Sample(c0)));
        let sampled = model.step(&mut be, &mut ctx, &batch).expect("step 2");
        check_row(
            &format!("{name} step 2 seq 1"),
            &ctx,
            &mut be,
            1,
            &a1.logits[0],
            tol,
        );
        check_row(
            &format!("{name} step 2 seq 0"),
            &ctx,
            &mut be,
            2,
            &a0.logits[1],
            tol,
        );
        let got: Vec<(usize, u32)> = sampled.iter().map(|s| (s.seq, s.token)).collect();
        if tokens == Tokens::Equal {
            assert_eq!(got, vec![(1, a1.sampled[0]), (0, a0.sampled[1])], "{name}");
        }

        // Decode steps of both, rows in either order, each with its own sampler.
        for i in 0..3 {
            let mut batch = StepBatch::new();
            let r1 = row(1, 5 + i, fed1[i], RowKind::Decode, RowOutput::Sample(c1));
            let r0 = row(
                0,
                10 + i,
                fed0[i + 1],
                RowKind::Decode,
                RowOutput::Sample(c0),
            );
            let (first, second) = if i % 2 == 0 { (r0, r1) } else { (r1, r0) };
            batch.push(first);
            batch.push(second);
            let sampled = model.step(&mut be, &mut ctx, &batch).expect("decode step");
            for (at, r) in [(0, first), (1, second)] {
                let (want_logits, want_token) = if r.seq == 0 {
                    (&a0.logits[i + 2], a0.sampled[i + 2])
                } else {
                    (&a1.logits[i + 1], a1.sampled[i + 1])
                };
                let what = format!("{name} decode {i} seq {}", r.seq);
                check_row(&what, &ctx, &mut be, at, want_logits, tol);
                if tokens == Tokens::Equal {
                    assert_eq!(sampled[at].token, want_token, "{what}");
                }
            }
        }
        assert_eq!((ctx.len(0), ctx.len(1)), (13, 8));
    }
}

#[test]
fn a_batch_out_of_order_is_refused_and_changes_nothing() {
    let file = Arc::new(preset_file(Preset::TinyLlama));
    let mut be = CpuBackend::new(Precision::Exact);
    let model = Model::load(&file, &mut be).expect("load");
    let mut ctx = Context::new(&model, &mut be, options(2)).expect("context");
    model
        .step(
            &mut be,
            &mut ctx,
            &StepBatch::prefill(0, 0, &[1, 2, 3], RowOutput::Logits),
        )
        .expect("a prompt");
    let cases = [
        (
            StepBatch::decode(0, 5, 1, RowOutput::Logits),
            "next position is 3",
        ),
        (
            StepBatch::decode(2, 0, 1, RowOutput::Logits),
            "context of 2 sequences",
        ),
        (StepBatch::new(), "empty step batch"),
        (
            StepBatch::prefill(0, 3, &[1; 17], RowOutput::Logits),
            "at most 16",
        ),
        (
            {
                // Three rows want logits; the context keeps one per sequence.
                let mut b = StepBatch::prefill(0, 3, &[1, 2], RowOutput::Logits);
                b.set_output(0, RowOutput::Logits);
                b.push_prefill(1, 0, &[1], RowOutput::Logits);
                b
            },
            "keeps 2 per step",
        ),
    ];
    for (batch, needle) in cases {
        let e = model
            .step(&mut be, &mut ctx, &batch)
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{e:?} does not say {needle:?}");
        assert_eq!(
            (ctx.len(0), ctx.len(1)),
            (3, 0),
            "a refused batch changed the context"
        );
    }
    // Past the context.
    let long = vec![1u32; 16];
    let mut at = 3;
    while at + 16 <= CONTEXT {
        model
            .step(
                &mut be,
                &mut ctx,
                &StepBatch::prefill(0, at, &long, RowOutput::Nothing),
            )
            .expect("fill");
        at += 16;
    }
    let e = model
        .step(
            &mut be,
            &mut ctx,
            &StepBatch::prefill(0, at, &long, RowOutput::Nothing),
        )
        .unwrap_err();
    assert!(matches!(e, decode::DecodeError::ContextFull { .. }), "{e}");
}
