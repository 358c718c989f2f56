//! The vendor BLAS library's workspace is an allocation of rocm-alloc under the workspace tag,
//! and the library takes no device memory of its own while it multiplies: a prefill that runs
//! on it leaves the bytes outside the allocator short of one workspace. Skips with a printed
//! reason without a GPU, or without the vendor library (unless `HIPDECODE_REQUIRE_BLAS=1`).

mod common;

use common::*;
use decode::backend::gpu::vendor_gemm::LIBRARY_WORKSPACE_BYTES;
use decode::backend::gpu::GpuBackend;
use decode::backend::Backend;
use decode::context::ContextOptions;
use decode::gguf_loader::synth::Preset;
use decode::session::Session;
use rocm_alloc::{BlockState, Tag};
use std::sync::Arc;

#[test]
fn the_blas_workspace_is_allocated_through_rocm_alloc_under_the_workspace_tag() {
    let test = "the_blas_workspace_is_allocated_through_rocm_alloc_under_the_workspace_tag";
    let Some(device) = hip_ffi::testing::device_or_skip(test) else {
        return;
    };
    let require = hip_ffi::knobs::REQUIRE_BLAS.read().unwrap();
    let backend = GpuBackend::new(device, 64, true).expect("the GPU backend starts");
    let described = backend.describe();
    if !described.contains("BLASLt") {
        assert!(
            !require,
            "HIPDECODE_REQUIRE_BLAS=1 but the vendor library is not in use: {described}"
        );
        eprintln!("skipping {test}: the vendor BLAS library is not in use ({described})");
        return;
    }
    let alloc = Arc::clone(backend.allocator());
    let file = Arc::new(preset_file(Preset::TinyLlama));
    let options = ContextOptions {
        context: 128,
        max_batch: 64,
        all_logits: false,
        sequences: 1,
        kv_blocks: None,
    };
    let mut model = Session::load(&file, backend, options).expect("load");

    // The library's workspace: one active block of exactly its size, tagged workspace.
    let snap = alloc.snapshot();
    let workspace_blocks = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| {
            b.state == BlockState::Active
                && b.tag == Some(Tag::Workspace)
                && b.size == LIBRARY_WORKSPACE_BYTES as u64
        })
        .count();
    assert!(
        workspace_blocks >= 1,
        "no active {LIBRARY_WORKSPACE_BYTES}-byte workspace block in the allocator:\n{}",
        snap.to_json()
    );

    // A prefill of 48 tokens runs its products on the library. Nothing new is allocated in
    // the allocator, and the device memory outside it grows by less than one workspace: had
    // the library taken its workspace itself, that alone would be 32 MiB.
    let outside = |m: &Session<GpuBackend>| {
        m.backend()
            .device_memory()
            .expect("a device backend")
            .expect("reading device memory")
    };
    let before = outside(&model);
    let tokens: Vec<u32> = (0..48u32).map(|i| 1 + (i * 37) % 200).collect();
    model.forward(&tokens).expect("prefill");
    model.last_argmax().expect("argmax");
    let after = outside(&model);
    let grown = after
        .outside_allocator
        .saturating_sub(before.outside_allocator);
    eprintln!(
        "{described}: outside the allocator {} -> {} bytes over a 48-token prefill",
        before.outside_allocator, after.outside_allocator
    );
    assert_eq!(
        after.stats.tag(Tag::Workspace).current,
        before.stats.tag(Tag::Workspace).current,
        "the prefill allocated workspace after load"
    );
    assert!(
        grown < LIBRARY_WORKSPACE_BYTES as u64,
        "the device lost {grown} bytes outside the allocator during the prefill: the library \
         took memory of its own"
    );
}
