//! Decode steps padded up to a graph bucket: a server's steps carry a row per running
//! sequence, and a GPU backend that replays graphs captured for a few row counts pads each
//! step up to its bucket (`StepBatch::padded_to`). The padding rows must leave every real row's
//! logits as they were and store nothing in any sequence's KV cache, which the later steps of
//! the sequences whose first block a padding row points at would show.

mod common;

use common::preset_file;
use decode::backend::cpu::CpuBackend;
use decode::backend::gpu::{graph_rows, GpuBackend, GraphRows, KvType, MatvecPath};
use decode::backend::{Backend, Precision};
use decode::batch::{RowOutput, StepBatch};
use decode::context::{Context, ContextOptions};
use decode::gguf_loader::synth::Preset;
use decode::model::{Model, ModelSpec};
use decode::GgufFile;
use std::sync::Arc;
use test_support::tolerance::max_abs_diff;

const SEQUENCES: usize = 16;
/// Sequences given a prompt: the rest of the context's sequences stay empty.
const STARTED: usize = 12;

/// The GPU's exact path against itself: f32 throughout, as step_batch's GPU_TOL (a step of 16
/// rows may split attention's keys otherwise than one of 10).
const GPU_TOL: f32 = 1e-3;

fn options() -> ContextOptions {
    ContextOptions {
        context: 64,
        max_batch: SEQUENCES,
        all_logits: false,
        sequences: SEQUENCES,
        kv_blocks: None,
    }
}

/// The row counts of the decode steps of [`run`]: each of the first ones pads to 16 rows.
const DECODE_ROWS: [usize; 4] = [10, 11, 9, 10];

/// Every sequence of [`STARTED`] gets a prompt; then decode steps of sequences 1..=rows for
/// each of [`DECODE_ROWS`] (padding rows point at sequence 1's first block), a step of
/// sequences 0 and 11 (which the padded steps left out) and one of sequence 1 alone. Returns
/// every real row's logits of the decode steps, in order.
fn run<B: Backend>(file: &Arc<GgufFile>, be: &mut B) -> Vec<Vec<f32>> {
    let vocab = ModelSpec::from_gguf(file).expect("spec").vocab as u32;
    let model = Model::load(file, be).expect("load");
    let mut ctx = Context::new(&model, be, options()).expect("a 16-sequence context");
    for s in 0..STARTED {
        let prompt: Vec<u32> = (0..3 + s % 4)
            .map(|i| (i * 7 + s * 5 + 1) as u32 % vocab)
            .collect();
        model
            .step(
                be,
                &mut ctx,
                &StepBatch::prefill(s, 0, &prompt, RowOutput::Logits),
            )
            .expect("a prompt");
    }
    let mut steps: Vec<Vec<usize>> = DECODE_ROWS.iter().map(|&n| (1..=n).collect()).collect();
    steps.push(vec![0, STARTED - 1]);
    steps.push(vec![1]);
    let mut logits = Vec::new();
    for (i, seqs) in steps.iter().enumerate() {
        let mut batch = StepBatch::new();
        for &s in seqs {
            let token = (i * 11 + s * 3 + 2) as u32 % vocab;
            batch.push(decode::batch::BatchRow {
                seq: s,
                pos: ctx.len(s),
                token,
                kind: decode::batch::RowKind::Decode,
                output: RowOutput::Logits,
            });
        }
        model.step(be, &mut ctx, &batch).expect("a decode step");
        for row in 0..seqs.len() {
            let mut got = Vec::new();
            ctx.read_logits(be, row, &mut got).expect("logits");
            logits.push(got);
        }
    }
    logits
}

#[test]
fn padded_decode_steps_leave_every_real_row_bitwise_as_it_was_on_the_cpu() {
    for preset in Preset::ALL.into_iter().filter(|p| p.is_tiny()) {
        let name = preset.name();
        let file = Arc::new(preset_file(preset));
        let mut plain = CpuBackend::new(Precision::Exact);
        let want = run(&file, &mut plain);
        let mut padded = CpuBackend::new(Precision::Exact);
        padded.pad_decode_steps(true);
        let got = run(&file, &mut padded);
        assert_eq!(plain.padding_rows_run(), 0, "{name}");
        let padding: usize = DECODE_ROWS.iter().map(|&n| graph_rows::bucket(n) - n).sum();
        assert_eq!(
            padded.padding_rows_run(),
            padding,
            "{name}: the steps were not padded"
        );
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // Bitwise, NaN included (NaN != NaN fails it).
            assert!(g == w, "{name}: logits row {i} changed under padding");
        }
    }
}

#[test]
fn on_the_gpu_padded_steps_replay_one_graph_per_bucket_and_keep_the_logits() {
    let test = "on_the_gpu_padded_steps_replay_one_graph_per_bucket_and_keep_the_logits";
    let _lock = test_support::gpu::gpu_lock();
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let make = |rows: GraphRows| {
        let mut be = GpuBackend::new(device, SEQUENCES, true).expect("the GPU backend starts");
        be.set_matvec_path(MatvecPath::Exact);
        be.set_kv_type(KvType::F32);
        be.set_graph_rows(rows);
        be
    };
    let mut counts: Vec<usize> = DECODE_ROWS.to_vec();
    counts.extend([2, 1]);
    let graphs = |f: fn(usize) -> usize| {
        let mut keys: Vec<usize> = counts.iter().map(|&n| f(n)).collect();
        keys.sort();
        keys.dedup();
        keys.len()
    };
    for preset in Preset::ALL.into_iter().filter(|p| p.is_tiny()) {
        let name = preset.name();
        let file = Arc::new(preset_file(preset));
        let mut exact = make(GraphRows::Exact);
        let want = run(&file, &mut exact);
        let mut buckets = make(GraphRows::Buckets);
        let got = run(&file, &mut buckets);
        assert_eq!(exact.graphs_captured(), graphs(|n| n), "{name}: exact keys");
        // MoE presets whose padded step would take the grouped prefill path are not padded.
        let padded = buckets.graphs_captured();
        assert!(
            padded == graphs(graph_rows::bucket) || padded == graphs(|n| n),
            "{name}: {padded} graphs captured"
        );
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let diff = max_abs_diff(g, w);
            assert!(
                diff <= GPU_TOL,
                "{name}: logits row {i} differs by {diff} under padding (allowed {GPU_TOL})"
            );
        }
        eprintln!(
            "{name}: {padded} graphs with buckets, {} exact",
            exact.graphs_captured()
        );
    }
}
