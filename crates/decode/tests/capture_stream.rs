//! Decode graphs captured on a side stream, or into the stream's shared pool, compute exactly
//! what the default (current stream, private pool) computes: the same kernels in the same
//! order, so the logits of every decode step are bit-for-bit equal. With a side stream the
//! allocator knows the main stream, and the graph books count the captures. Skips with a
//! printed reason without a GPU.

mod common;

use common::*;
use decode::backend::gpu::capture_stream::{CaptureStream, GraphPoolMode};
use decode::backend::gpu::GpuBackend;
use decode::backend::Backend;
use decode::context::ContextOptions;
use decode::gguf_loader::synth::Preset;
use decode::session::Session;
use std::sync::Arc;
use test_support::gpu::gpu_lock;

/// Logits of 6 decode steps after a 5-token prompt (the first step runs the capture, the rest
/// replay it), and the backend's device memory at the end.
fn decode_logits(
    file: &Arc<decode::gguf_loader::GgufFile>,
    backend: GpuBackend,
) -> (Vec<f32>, decode::memory::DeviceMemory, Option<u64>) {
    let main = backend.stream_id().value();
    let alloc = Arc::clone(backend.allocator());
    let options = ContextOptions {
        context: 64,
        max_batch: 8,
        all_logits: false,
        sequences: 1,
        kv_blocks: None,
    };
    let mut model = Session::load(file, backend, options).expect("load");
    model.forward(&[1, 5, 9, 13, 17]).expect("prompt");
    let mut all = Vec::new();
    let mut next = model.last_argmax().expect("argmax");
    for _ in 0..6 {
        model.decode(next).expect("decode step");
        let mut logits = Vec::new();
        model.last_logits(&mut logits).expect("logits");
        all.extend_from_slice(&logits);
        next = model.last_argmax().expect("argmax");
    }
    let memory = model
        .backend()
        .device_memory()
        .expect("a device backend")
        .expect("device memory");
    let snapshot_main = alloc.snapshot().main_stream.map(|s| s.value());
    assert!(snapshot_main.is_none() || snapshot_main == Some(main));
    (all, memory, snapshot_main)
}

#[test]
fn side_stream_and_shared_pool_captures_decode_exactly_as_the_default() {
    let test = "side_stream_and_shared_pool_captures_decode_exactly_as_the_default";
    let _one_at_a_time = gpu_lock();
    let file = Arc::new(preset_file(Preset::TinyLlama));
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let backend = || GpuBackend::new(device, 8, true).expect("the GPU backend starts");
    let (want, memory, main) = decode_logits(&file, backend());
    assert!(
        main.is_none(),
        "no main stream is named without a side stream"
    );
    assert_eq!(
        memory.graph.captures, 1,
        "one decode graph: {:?}",
        memory.graph
    );
    assert!(memory.graph.kernel_nodes > 0, "{:?}", memory.graph);
    assert!(memory.graph.estimate > 0, "{:?}", memory.graph);
    for (stream, pool) in [
        (CaptureStream::Side, GraphPoolMode::Private),
        (CaptureStream::Side, GraphPoolMode::Shared),
        (CaptureStream::Current, GraphPoolMode::Shared),
    ] {
        let mut be = backend();
        be.set_capture(stream, pool)
            .expect("set before any capture");
        let (got, memory, main) = decode_logits(&file, be);
        assert_eq!(
            got, want,
            "{stream:?} {pool:?}: the logits differ from the default's"
        );
        assert_eq!(memory.graph.captures, 1, "{stream:?} {pool:?}");
        assert_eq!(
            main.is_some(),
            stream == CaptureStream::Side,
            "{stream:?}: the allocator names the main stream exactly when graphs run on a side one"
        );
        eprintln!(
            "{stream:?} {pool:?}: {} kernel nodes, estimate {} B, measured {} B outside + {} B pool; stranded {:?}",
            memory.graph.kernel_nodes,
            memory.graph.estimate,
            memory.graph.measured_outside,
            memory.graph.measured_pool,
            memory.stranded
        );
    }
}

#[test]
fn the_capture_cannot_move_after_a_graph_exists() {
    let test = "the_capture_cannot_move_after_a_graph_exists";
    let _one_at_a_time = gpu_lock();
    let file = Arc::new(preset_file(Preset::TinyLlama));
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let backend = GpuBackend::new(device, 8, true).expect("the GPU backend starts");
    let options = ContextOptions {
        context: 16,
        max_batch: 8,
        all_logits: false,
        sequences: 1,
        kv_blocks: None,
    };
    let mut model = Session::load(&file, backend, options).expect("load");
    model.decode(3).expect("a decode step, captured");
    let e = model
        .backend_mut()
        .set_capture(CaptureStream::Side, GraphPoolMode::Private)
        .unwrap_err()
        .to_string();
    assert!(e.contains("before the first decode graph"), "{e}");
}
