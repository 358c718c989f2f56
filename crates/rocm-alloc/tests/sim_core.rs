//! The backend-independent core scenarios on `SimDevice`.

mod common;

use std::sync::Arc;

use rocm_alloc::devices::sim::SimDevice;
use rocm_alloc::{RawDevice, StreamId};

/// A simulated device and two of its streams.
fn device() -> (Arc<dyn RawDevice>, [StreamId; 2]) {
    let d = SimDevice::discrete(8 << 30);
    let s = [d.create_stream(), d.create_stream()];
    (Arc::new(d), s)
}

#[test]
fn reuse_hits_cache() {
    let (d, s) = device();
    common::reuse_hits_cache(d, s);
}

#[test]
fn split_and_merge() {
    let (d, s) = device();
    common::split_and_merge(d, s);
}

#[test]
fn streams_have_separate_pools() {
    let (d, s) = device();
    common::streams_have_separate_pools(d, s);
}

#[test]
fn record_stream_eventually_frees() {
    let (d, s) = device();
    common::record_stream_eventually_frees(d, s);
}

#[test]
fn memory_limit_gives_oom_report() {
    let (d, s) = device();
    common::memory_limit_gives_oom_report(d, s);
}

#[test]
fn clear_cache_and_peaks() {
    let (d, s) = device();
    common::clear_cache_and_peaks(d, s);
}

#[test]
fn snapshot_and_trace() {
    let (d, s) = device();
    common::snapshot_and_trace(d, s);
}

#[test]
fn raw_api() {
    let (d, s) = device();
    common::raw_api(d, s);
}

#[test]
fn threads_stress() {
    let (d, s) = device();
    common::threads_stress(d, s);
}

#[test]
fn dropping_the_allocator_returns_everything() {
    let sim = Arc::new(SimDevice::discrete(1 << 30));
    let alloc = common::allocator(sim.clone());
    let s = [sim.create_stream(), sim.create_stream()];
    let _leaked_raw = alloc
        .raw_alloc(5 << 20, s[0], rocm_alloc::Tag::Other)
        .unwrap();
    let a = alloc.alloc(100, s[1], rocm_alloc::Tag::Other).unwrap();
    drop(a);
    assert_eq!(sim.stats().live, 2);
    drop(alloc);
    assert_eq!(sim.stats().live, 0);
    assert_eq!(sim.stats().used, 0);
}
