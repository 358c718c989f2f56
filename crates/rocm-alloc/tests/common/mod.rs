//! Core allocator scenarios that run against any backend: `SimDevice` here, the HIP backend on
//! a GPU. Each takes the device and two distinct streams that belong to it.

#![allow(dead_code)]

use std::sync::Arc;

use rand::Rng;
use rocm_alloc::{
    AllocError, Allocator, AllocatorConfig, BlockState, LimitSpec, RawDevice, StreamId, Tag,
};

pub fn allocator(device: Arc<dyn RawDevice>) -> Allocator {
    let config = AllocatorConfig {
        read_env: false,
        ..Default::default()
    };
    Allocator::new(device, config).expect("allocator")
}

/// Blocks handed out never overlap, and each lies within a segment.
pub fn assert_no_overlap(alloc: &Allocator) {
    let snap = alloc.snapshot();
    let mut segs: Vec<(u64, u64)> = snap.segments.iter().map(|s| (s.address, s.size)).collect();
    segs.sort_unstable();
    for w in segs.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "segments overlap: {w:?}");
    }
    for s in &snap.segments {
        let mut at = s.address;
        for b in &s.blocks {
            assert_eq!(b.address, at, "blocks tile their segment");
            at += b.size;
        }
        assert_eq!(at, s.address + s.size);
    }
}

pub fn reuse_hits_cache(device: Arc<dyn RawDevice>, s: [StreamId; 2]) {
    let alloc = allocator(device);
    let sizes = [1u64, 700, 4096, 1 << 20, (1 << 20) + 1, 5 << 20, 33 << 20];
    let first: Vec<_> = sizes
        .iter()
        .map(|&n| alloc.alloc(n, s[0], Tag::Activations).unwrap())
        .collect();
    let allocs_after_first = alloc.stats().device_allocs;
    assert!(
        allocs_after_first >= 3,
        "small, shared-large and own-segment large requests"
    );
    let addrs: Vec<u64> = first.iter().map(|a| a.ptr()).collect();
    drop(first);
    let stats = alloc.stats();
    assert_eq!(stats.active_bytes, 0);
    assert_eq!(stats.cached_bytes, stats.reserved_bytes);
    let second: Vec<_> = sizes
        .iter()
        .map(|&n| alloc.alloc(n, s[0], Tag::Activations).unwrap())
        .collect();
    let again: Vec<u64> = second.iter().map(|a| a.ptr()).collect();
    assert_eq!(
        addrs, again,
        "the same sequence gets the same addresses from the cache"
    );
    let after = alloc.stats();
    assert_eq!(
        after.device_allocs, allocs_after_first,
        "no device call on reuse"
    );
    assert_eq!(after.cache_hits, sizes.len() as u64 + (stats.cache_hits));
    assert_no_overlap(&alloc);
}

pub fn split_and_merge(device: Arc<dyn RawDevice>, s: [StreamId; 2]) {
    let alloc = allocator(device);
    let a = alloc.alloc(4096, s[0], Tag::Workspace).unwrap();
    let b = alloc.alloc(8192, s[0], Tag::Workspace).unwrap();
    assert_eq!(
        b.ptr(),
        a.ptr() + 4096,
        "small requests are carved from one segment"
    );
    let snap = alloc.snapshot();
    assert_eq!(snap.segments.len(), 1);
    assert_eq!(snap.segments[0].size, 2 << 20);
    assert_eq!(snap.segments[0].blocks.len(), 3);
    drop(a);
    drop(b);
    let snap = alloc.snapshot();
    assert_eq!(snap.segments[0].blocks.len(), 1, "freed neighbours merge");
    assert_eq!(snap.segments[0].blocks[0].state, BlockState::Free);
    assert_eq!(alloc.stats().releasable_bytes, 2 << 20);
}

pub fn streams_have_separate_pools(device: Arc<dyn RawDevice>, s: [StreamId; 2]) {
    let alloc = allocator(device);
    let a = alloc.alloc(1 << 16, s[0], Tag::Other).unwrap();
    let pa = a.ptr();
    drop(a);
    let b = alloc.alloc(1 << 16, s[1], Tag::Other).unwrap();
    assert_ne!(
        b.ptr(),
        pa,
        "a block freed on one stream is not handed to another"
    );
    assert_eq!(alloc.stats().device_allocs, 2);
    let c = alloc.alloc(1 << 16, s[0], Tag::Other).unwrap();
    assert_eq!(c.ptr(), pa);
}

/// Cross-stream use on a device whose streams are idle: the free is deferred through events and
/// the block comes back once they complete.
pub fn record_stream_eventually_frees(device: Arc<dyn RawDevice>, s: [StreamId; 2]) {
    let alloc = allocator(device);
    let a = alloc.alloc(1 << 20, s[0], Tag::KvCache).unwrap();
    let pa = a.ptr();
    a.record_stream(s[1]).unwrap();
    drop(a);
    let mut remaining = alloc.process_pending().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while remaining > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
        remaining = alloc.process_pending().unwrap();
    }
    assert_eq!(remaining, 0, "events on an idle stream complete");
    let b = alloc.alloc(1 << 20, s[0], Tag::KvCache).unwrap();
    assert_eq!(b.ptr(), pa);
    assert_eq!(alloc.stats().pending_free_blocks, 0);
}

pub fn memory_limit_gives_oom_report(device: Arc<dyn RawDevice>, s: [StreamId; 2]) {
    let alloc = allocator(device);
    alloc.set_memory_limit(LimitSpec::Bytes(64 << 20)).unwrap();
    let w = alloc.alloc(40 << 20, s[0], Tag::Weights).unwrap();
    let err = alloc.alloc(30 << 20, s[0], Tag::KvCache).unwrap_err();
    let AllocError::OutOfMemory(report) = &err else {
        panic!("expected OOM, got {err}")
    };
    assert_eq!(report.requested, 30 << 20);
    assert_eq!(report.active, 40 << 20);
    assert_eq!(report.reserved, 40 << 20);
    assert_eq!(report.limit, Some(64 << 20));
    assert_eq!(report.per_tag, vec![(Tag::Weights, 40 << 20)]);
    let msg = err.to_string();
    assert!(
        msg.contains("HIPDECODE_MEMORY_LIMIT") && msg.contains("weights"),
        "{msg}"
    );
    assert_eq!(alloc.stats().oom_retries, 1);
    drop(w);
    // The idle 40 MiB segment is flushed by the OOM path, then the request fits.
    let k = alloc.alloc(30 << 20, s[0], Tag::KvCache).unwrap();
    assert!(alloc.stats().reserved_bytes <= 64 << 20);
    drop(k);
}

pub fn clear_cache_and_peaks(device: Arc<dyn RawDevice>, s: [StreamId; 2]) {
    let alloc = allocator(device);
    let a = alloc.alloc(3 << 20, s[0], Tag::Activations).unwrap();
    let b = alloc.alloc(100, s[1], Tag::Workspace).unwrap();
    let peak = alloc.stats().peak_active_bytes;
    assert_eq!(peak, (3 << 20) + 512);
    drop(a);
    drop(b);
    let st = alloc.stats();
    assert_eq!(st.peak_active_bytes, peak);
    assert_eq!(st.tag(Tag::Activations).peak, 3 << 20);
    alloc.reset_peak();
    let st = alloc.stats();
    assert_eq!(st.peak_active_bytes, 0);
    assert_eq!(st.tag(Tag::Activations).peak, 0);
    assert_eq!(st.peak_reserved_bytes, st.reserved_bytes);
    let released = alloc.clear_cache().unwrap();
    assert_eq!(released, st.reserved_bytes);
    let st = alloc.stats();
    assert_eq!(
        (st.reserved_bytes, st.cached_bytes, st.releasable_bytes),
        (0, 0, 0)
    );
    assert_eq!(st.device_frees, st.device_allocs);
}

pub fn snapshot_and_trace(device: Arc<dyn RawDevice>, s: [StreamId; 2]) {
    let alloc = allocator(device);
    alloc.enable_trace(16);
    let a = alloc.alloc(10_000, s[1], Tag::OffloadStaging).unwrap();
    let snap = alloc.snapshot();
    let json: serde_json::Value = serde_json::from_str(&snap.to_json()).unwrap();
    let block = &json["segments"][0]["blocks"][0];
    assert_eq!(block["address"].as_u64(), Some(a.ptr()));
    assert_eq!(block["state"], "active");
    assert_eq!(block["tag"], "offload_staging");
    assert_eq!(block["stream"].as_u64(), Some(s[1].value()));
    assert_eq!(block["pool"], "stream");
    assert_eq!(json["stats"]["active_bytes"].as_u64(), Some(10_240));
    drop(a);
    let log = alloc.disable_trace();
    let kinds: Vec<_> = log.events.iter().map(|e| e.kind).collect();
    use rocm_alloc::TraceKind::*;
    assert_eq!(kinds, vec![DeviceAlloc, Alloc, Free]);
    assert_eq!(log.events[1].size, 10_240);
    let _ = alloc.alloc(512, s[0], Tag::Other).unwrap();
    assert!(
        alloc.take_trace().events.is_empty(),
        "tracing is off after disable"
    );
}

pub fn raw_api(device: Arc<dyn RawDevice>, s: [StreamId; 2]) {
    let alloc = allocator(device);
    let p = alloc.raw_alloc(1000, s[0], Tag::Other).unwrap();
    assert!(matches!(
        alloc.raw_free(p + 512),
        Err(AllocError::UnknownPointer(_))
    ));
    alloc.raw_free(p).unwrap();
    assert!(
        matches!(alloc.raw_free(p), Err(AllocError::UnknownPointer(_))),
        "double free is an error"
    );
    assert!(matches!(
        alloc.alloc(0, s[0], Tag::Other),
        Err(AllocError::ZeroSize)
    ));
    let a = alloc.alloc(2048, s[0], Tag::Other).unwrap();
    let q = a.into_raw();
    assert_eq!(alloc.stats().active_bytes, 2048, "into_raw keeps the block");
    alloc.raw_free(q).unwrap();
    assert_eq!(alloc.stats().active_bytes, 0);
}

pub fn threads_stress(device: Arc<dyn RawDevice>, s: [StreamId; 2]) {
    let alloc = allocator(device);
    let threads = 4;
    std::thread::scope(|scope| {
        for t in 0..threads {
            let alloc = alloc.clone();
            scope.spawn(move || {
                let mut rng = test_support::rng::seeded(t);
                let mut live = Vec::new();
                for i in 0..3000 {
                    let size = (512 << rng.random_range(0..14)) + rng.random_range(0..512);
                    let stream = s[rng.random_range(0..2)];
                    let a = alloc.alloc(size, stream, Tag::ALL[i % Tag::COUNT]).unwrap();
                    if rng.random_ratio(1, 5) {
                        a.record_stream(s[0]).unwrap();
                    }
                    live.push(a);
                    if live.len() > 24 {
                        let k = rng.random_range(0..live.len());
                        live.swap_remove(k);
                    }
                }
            });
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while alloc.process_pending().unwrap() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let st = alloc.stats();
    assert_eq!(st.active_bytes, 0);
    assert!(st.per_tag.iter().all(|(_, u)| u.current == 0));
    assert_eq!(st.cached_bytes, st.reserved_bytes);
    assert_eq!(st.pending_free_blocks, 0);
    assert_eq!(st.cache_hits + st.cache_misses, threads * 3000);
    assert_no_overlap(&alloc);
    alloc.clear_cache().unwrap();
    assert_eq!(alloc.stats().reserved_bytes, 0);
}

/// Every core scenario, for backends that run them all in one test.
pub fn run_all(device: &dyn Fn() -> Arc<dyn RawDevice>, s: [StreamId; 2]) {
    reuse_hits_cache(device(), s);
    split_and_merge(device(), s);
    streams_have_separate_pools(device(), s);
    record_stream_eventually_frees(device(), s);
    memory_limit_gives_oom_report(device(), s);
    clear_cache_and_peaks(device(), s);
    snapshot_and_trace(device(), s);
    raw_api(device(), s);
    threads_stress(device(), s);
}
