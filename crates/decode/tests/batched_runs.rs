//! Batched decode against each request run alone: every tiny model and real Gemma 3 270M, in
//! contexts of 1, 3, 8 and 33 sequences, with more requests than sequences (so requests join
//! and leave mid-run), prompts of different lengths, and prompts that share a prefix (so later
//! requests find it in the prefix cache).
//!
//! - **GPU, both paths**, every context size.
//! - **CPU, fast path**, 33 sequences (generate_many.rs runs 1, 3 and 8 on the exact path): a
//!   row's 8-bit activations are quantized on their own, so tokens must be equal, and CI runs
//!   it.
//!
//! - **Exact path** (`MatvecPath::Exact`, f32 KV cache): f32 throughout, so each request's
//!   greedy tokens must equal its run alone, except at a near-tie of [`EXACT_TOL`].
//! - **int8 path** (the default: 8-bit activations, f16 KV cache): a step's rows share their
//!   products, and a step of many rows takes other kernels than a row alone. A request may
//!   part from its run alone only at a near-tie of [`INT8_TOL`].
//!
//! A near-tie (issue 21's rule) is a step where the single run's greedy token leads the
//! batched run's token by less than twice the tolerance the GPU conformance tests use for
//! that path, relative to max(1, RMS of the logits). The test prints how many requests parted,
//! and where; any other parting fails. step_batch.rs holds a batched row's logits to the same
//! tolerances.

mod common;

use common::{near_tie, preset_file};
use decode::backend::cpu::CpuBackend;
use decode::backend::gpu::{GpuBackend, KvType, MatvecPath};
use decode::backend::{Backend, Precision};
use decode::context::{Context, ContextOptions};
use decode::generate_many::{generate_many, Request, Stop};
use decode::gguf_loader::synth::Preset;
use decode::model::Model;
use decode::sampler::SamplerConfig;
use decode::session::Session;
use decode::GgufFile;
use hip_ffi::Device;
use std::sync::Arc;
use test_support::models::gemma_path;

/// The exact path's tolerance in the GPU conformance tests (`selftest::GPU_TOL`), relative to
/// max(1, RMS of the logits).
const EXACT_TOL: f32 = decode::selftest::GPU_TOL;

/// The int8 path's (`selftest::INT8_TOL`). A batched step takes other kernels than a row alone
/// (the int8 matrix-core product for 9 to 64 rows, flash prefill attention with its f16
/// queries and probabilities for a prompt chunk among many rows), so its logits differ from
/// the single run's by more than the order of its sums.
const INT8_TOL: f32 = decode::selftest::INT8_TOL;

/// Positions of every sequence: the longest prompt and limit below fit.
const CONTEXT: usize = 96;

#[derive(Clone, Copy, Debug)]
enum Path {
    Exact,
    Int8,
}

impl Path {
    fn tol(self) -> f32 {
        match self {
            Path::Exact => EXACT_TOL,
            Path::Int8 => INT8_TOL,
        }
    }

    fn backend(self, device: Device) -> GpuBackend {
        let mut be = GpuBackend::new(device, 64, true).expect("the GPU backend starts");
        if let Path::Exact = self {
            be.set_matvec_path(MatvecPath::Exact);
            be.set_kv_type(KvType::F32);
        }
        be
    }
}

fn options(max_batch: usize, sequences: usize) -> ContextOptions {
    ContextOptions {
        context: CONTEXT,
        max_batch,
        all_logits: false,
        sequences,
        kv_blocks: None,
    }
}

/// `n` greedy requests over `vocab`: every third starts with the same 37-token prefix (two
/// full KV blocks of 16 and part of a third) and goes on with its own tokens; the others have
/// prompts of 1 to 29 tokens of their own. Limits run from 4 to `max_new`, so requests leave
/// at different steps.
fn requests(n: usize, vocab: u32, max_new: usize) -> Vec<Request> {
    let shared: Vec<u32> = (0..37).map(|j| (j * 11 + 3) % vocab).collect();
    (0..n)
        .map(|i| {
            let own = (0..1 + (i * 7) % 29).map(|j| (j as u32 * 31 + i as u32 * 17 + 1) % vocab);
            let prompt = if i % 3 == 0 {
                shared.iter().copied().chain(own.take(1 + i % 5)).collect()
            } else {
                own.collect()
            };
            Request {
                prompt,
                sampler: SamplerConfig::default(),
                max_new: 4 + (i * 5) % (max_new - 3),
                stop: Stop::Tokens(Vec::new()),
            }
        })
        .collect()
}

/// Runs `reqs` through a context of `sequences` sequences and each alone on a one-sequence
/// session, on backends `backend` makes: the requests that parted from their run alone at a
/// near-tie of `tol`, as text. Any other parting, or a different length, panics.
fn check_batched<B: Backend>(
    what: &str,
    file: &Arc<GgufFile>,
    backend: &dyn Fn() -> B,
    tol: f32,
    sequences: usize,
    reqs: &[Request],
) -> Vec<String> {
    let mut be = backend();
    let model = Model::load(file, &mut be).expect("load");
    let mut ctx = Context::new(&model, &mut be, options(64, sequences)).expect("context");
    let report = generate_many(&model, &mut be, &mut ctx, reqs, &mut |_, _| {})
        .unwrap_or_else(|e| panic!("{what}: generate_many failed: {e}"));
    drop(ctx);
    drop(model);
    drop(be);
    let mut single =
        Session::load(file, backend(), options(64, 1)).expect("a one-sequence session");
    let mut ties = Vec::new();
    for (i, (r, got)) in reqs.iter().zip(&report.requests).enumerate() {
        single.reset();
        let alone = decode::generate::generate(
            &mut single,
            &r.prompt,
            r.max_new,
            r.sampler,
            &|_| false,
            &mut |_| {},
        )
        .expect("alone");
        let want = &alone.tokens;
        assert_eq!(got.tokens.len(), want.len(), "{what}: request {i}'s length");
        let Some(at) = (0..want.len()).find(|&k| want[k] != got.tokens[k]) else {
            continue;
        };
        // The single run's logits where the two parted: the prompt, then its own tokens.
        single.reset();
        single.forward(&r.prompt).expect("prefill");
        for &t in &want[..at] {
            single.decode(t).expect("decode");
        }
        let mut logits = Vec::new();
        single.last_logits(&mut logits).expect("logits");
        match near_tie(&logits, want[at], got.tokens[at], tol) {
            Ok(margin) => ties.push(format!("request {i} at token {at}: {margin}")),
            Err(margin) => panic!(
                "{what}: request {i} (prompt {}, limit {}) parts from its run alone at token \
                 {at}, not at a near-tie: {margin}\n  batched {:?}\n  alone   {want:?}",
                r.prompt.len(),
                r.max_new,
                got.tokens
            ),
        }
    }
    ties
}

/// Every context size of the issue on `file`, on both paths; prints the partings.
fn check_every_size(name: &str, file: &Arc<GgufFile>, device: Device, max_new: usize) {
    let vocab = decode::model::ModelSpec::from_gguf(file)
        .expect("spec")
        .vocab as u32;
    for path in [Path::Exact, Path::Int8] {
        for sequences in [1usize, 3, 8, 33] {
            // Half again as many requests as sequences, so some wait for a freed slot.
            let n = sequences + sequences.div_ceil(2);
            let reqs = requests(n, vocab, max_new);
            let what = format!("{name}, {path:?} path, {n} requests in {sequences} sequences");
            let backend = || path.backend(device);
            let ties = check_batched(&what, file, &backend, path.tol(), sequences, &reqs);
            print_ties(&what, n, &ties);
        }
    }
}

fn print_ties(what: &str, n: usize, ties: &[String]) {
    eprintln!("{what}: {} of {n} parted at a near-tie", ties.len());
    for t in ties {
        eprintln!("  {t}");
    }
}

#[test]
fn every_tiny_model_batched_on_the_cpu_runs_as_each_request_alone() {
    for preset in Preset::ALL.into_iter().filter(|p| p.is_tiny()) {
        let file = Arc::new(preset_file(preset));
        let vocab = decode::model::ModelSpec::from_gguf(&file)
            .expect("spec")
            .vocab as u32;
        let (sequences, n) = (33, 50);
        let reqs = requests(n, vocab, 12);
        let what = format!(
            "{}, CPU fast path, {n} requests in {sequences}",
            preset.name()
        );
        let fast = || CpuBackend::new(Precision::Fast);
        // Tolerance 0: each row is computed on its own, so only equal tokens pass.
        let ties = check_batched(&what, &file, &fast, 0.0, sequences, &reqs);
        assert!(ties.is_empty(), "{what}: {ties:?}");
    }
}

#[test]
fn every_tiny_model_batched_on_the_gpu_runs_as_each_request_alone() {
    let test = "every_tiny_model_batched_on_the_gpu_runs_as_each_request_alone";
    let _lock = test_support::gpu::gpu_lock();
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    for preset in Preset::ALL.into_iter().filter(|p| p.is_tiny()) {
        let file = Arc::new(preset_file(preset));
        check_every_size(preset.name(), &file, device, 12);
    }
}

#[test]
fn real_gemma_batched_on_the_gpu_runs_as_each_request_alone() {
    let test = "real_gemma_batched_on_the_gpu_runs_as_each_request_alone";
    let _lock = test_support::gpu::gpu_lock();
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let Some(path) = gemma_path() else {
        return;
    };
    let file = decode::open_model(&path).expect("the Gemma file opens");
    check_every_size("gemma3-270m", &file, device, 16);
}

/// After a warm-up run, batched steps allocate nothing on the device: a second run of requests
/// of the same lengths (other tokens), through the same context of 8 sequences, makes no call
/// of the device allocator and leaves its active bytes as they were, on both paths.
#[test]
fn batched_steps_allocate_nothing_on_the_device_after_warm_up() {
    let test = "batched_steps_allocate_nothing_on_the_device_after_warm_up";
    let _lock = test_support::gpu::gpu_lock();
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let file = Arc::new(preset_file(Preset::TinyQwen3Moe));
    let vocab = decode::model::ModelSpec::from_gguf(&file)
        .expect("spec")
        .vocab as u32;
    for path in [Path::Exact, Path::Int8] {
        let mut be = path.backend(device);
        let alloc = Arc::clone(be.allocator());
        let model = Model::load(&file, &mut be).expect("load");
        let mut ctx = Context::new(&model, &mut be, options(64, 8)).expect("context");
        let warm_up = requests(12, vocab, 12);
        generate_many(&model, &mut be, &mut ctx, &warm_up, &mut |_, _| {}).expect("warm-up");
        let warm = alloc.stats();
        // The same lengths, every token moved, so no prompt is found in the prefix cache.
        let again: Vec<Request> = (warm_up.iter())
            .map(|r| Request {
                prompt: r.prompt.iter().map(|&t| (t + 1) % vocab).collect(),
                sampler: r.sampler,
                max_new: r.max_new,
                stop: Stop::Tokens(Vec::new()),
            })
            .collect();
        generate_many(&model, &mut be, &mut ctx, &again, &mut |_, _| {}).expect("second run");
        let after = alloc.stats();
        assert_eq!(
            (after.device_allocs, after.device_frees),
            (warm.device_allocs, warm.device_frees),
            "{path:?}: batched steps called the device allocator after the warm-up"
        );
        assert_eq!(
            after.active_bytes, warm.active_bytes,
            "{path:?}: batched steps changed the allocator's active bytes after the warm-up"
        );
    }
}
