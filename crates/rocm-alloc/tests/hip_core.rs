//! The core scenarios against the HIP backend (through CUDA on NVIDIA). Skips with a printed
//! reason when no GPU is present.

mod common;

use std::sync::Arc;

use rocm_alloc::backends::hip::HipDevice;
use rocm_alloc::{Allocator, AllocatorConfig, RawDevice, StreamId, Tag};

fn device_or_skip() -> Option<Arc<HipDevice>> {
    match HipDevice::first() {
        Ok(d) => Some(Arc::new(d)),
        Err(reason) => {
            eprintln!("skipping HIP allocator tests: no GPU ({reason})");
            None
        }
    }
}

#[test]
fn core_scenarios_on_hip() {
    let Some(dev) = device_or_skip() else { return };
    let (s1, _k1) = dev.create_stream().unwrap();
    let (s2, _k2) = dev.create_stream().unwrap();
    let d = dev.clone();
    common::run_all(&move || d.clone() as Arc<dyn RawDevice>, [s1, s2]);
}

#[test]
fn hip_memory_is_real_and_bounded() {
    let Some(dev) = device_or_skip() else { return };
    let info = dev.memory_info().unwrap();
    assert!(info.total > 0 && info.free <= info.total);
    let alloc = Allocator::new(
        dev.clone(),
        AllocatorConfig {
            read_env: false,
            ..Default::default()
        },
    )
    .unwrap();
    let limit = alloc.memory_limit().unwrap();
    assert!(
        limit < info.total,
        "default limit {limit} is below total {}",
        info.total
    );
    // The device really gives up the memory while the allocator holds it, and gets it back.
    let free_before = dev.memory_info().unwrap().free;
    let a = alloc
        .alloc(256 << 20, StreamId::DEFAULT, Tag::Workspace)
        .unwrap();
    let free_during = dev.memory_info().unwrap().free;
    assert!(
        free_before - free_during >= 256 << 20,
        "{free_before} -> {free_during}"
    );
    assert_ne!(a.ptr(), 0);
    drop(a);
    assert_eq!(alloc.clear_cache().unwrap(), 256 << 20);
    assert_eq!(alloc.stats().reserved_bytes, 0);
    let free_after = dev.memory_info().unwrap().free;
    assert!(
        free_after >= free_during + (256 << 20),
        "{free_during} -> {free_after}"
    );
}
