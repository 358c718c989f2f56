//! The backend-independent core scenarios on `SimDevice`.

mod common;

use std::sync::Arc;

use rocm_alloc::backends::sim::SimDevice;
use rocm_alloc::{RawDevice, StreamId};

const S: [StreamId; 2] = [StreamId(1), StreamId(2)];

fn device() -> Arc<dyn RawDevice> {
    Arc::new(SimDevice::discrete(8 << 30))
}

#[test]
fn reuse_hits_cache() {
    common::reuse_hits_cache(device(), S);
}

#[test]
fn split_and_merge() {
    common::split_and_merge(device(), S);
}

#[test]
fn streams_have_separate_pools() {
    common::streams_have_separate_pools(device(), S);
}

#[test]
fn record_stream_eventually_frees() {
    common::record_stream_eventually_frees(device(), S);
}

#[test]
fn memory_limit_gives_oom_report() {
    common::memory_limit_gives_oom_report(device(), S);
}

#[test]
fn clear_cache_and_peaks() {
    common::clear_cache_and_peaks(device(), S);
}

#[test]
fn snapshot_and_trace() {
    common::snapshot_and_trace(device(), S);
}

#[test]
fn raw_api() {
    common::raw_api(device(), S);
}

#[test]
fn threads_stress() {
    common::threads_stress(device(), S);
}

#[test]
fn dropping_the_allocator_returns_everything() {
    let sim = Arc::new(SimDevice::discrete(1 << 30));
    let alloc = common::allocator(sim.clone());
    let _leaked_raw = alloc
        .raw_alloc(5 << 20, S[0], rocm_alloc::Tag::Other)
        .unwrap();
    let a = alloc.alloc(100, S[1], rocm_alloc::Tag::Other).unwrap();
    drop(a);
    assert_eq!(sim.stats().live, 2);
    drop(alloc);
    assert_eq!(sim.stats().live, 0);
    assert_eq!(sim.stats().used, 0);
}
