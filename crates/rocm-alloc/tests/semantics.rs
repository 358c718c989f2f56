//! Behaviour that needs the simulated device's control over streams, failures and memory
//! layout: deferred cross-stream frees, graph pools, the decode arena, the OOM path, trimming,
//! limits and their environment overrides.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use rocm_alloc::backends::sim::{SimConfig, SimDevice};
use rocm_alloc::limits::{self, CACHE_FLOOR};
use rocm_alloc::{
    AllocError, Allocator, AllocatorConfig, BlockState, CaptureTarget, LimitSpec, OomCause,
    PoolName, StreamId, Tag, UmaInfo,
};

/// A simulated device, an allocator on it, and two streams of the device (main, side).
fn sim(capacity: u64) -> (Arc<SimDevice>, Allocator, [StreamId; 2]) {
    let d = Arc::new(SimDevice::discrete(capacity));
    let a = common::allocator(d.clone());
    let streams = [d.create_stream(), d.create_stream()];
    (d, a, streams)
}

#[test]
fn cross_stream_free_waits_for_events() {
    let (dev, alloc, [main, side]) = sim(1 << 30);
    let a = alloc.alloc(4096, main, Tag::Activations).unwrap();
    let pa = a.ptr();
    a.record_stream(side).unwrap();
    dev.submit_work(side); // a kernel on side reads the buffer
    drop(a);
    assert_eq!(
        alloc.stats().active_bytes,
        0,
        "the user's bytes are released at once"
    );
    let b = alloc.alloc(4096, main, Tag::Activations).unwrap();
    assert_ne!(b.ptr(), pa, "not reused while side may still read it");
    let snap = alloc.snapshot();
    let pending: Vec<_> = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::PendingFree)
        .collect();
    assert_eq!(
        pending.len(),
        1,
        "a stranded block is visible in the snapshot"
    );
    assert_eq!(pending[0].address, pa);
    assert_eq!(pending[0].stream_uses, vec![side]);
    assert_eq!(pending[0].tag, Some(Tag::Activations));
    drop(b);
    dev.complete_stream(side);
    let c = alloc.alloc(4096, main, Tag::Activations).unwrap();
    assert_eq!(
        c.ptr(),
        pa,
        "reused once the event completed (lowest address first)"
    );
    assert_eq!(dev.stats().live_events, 0, "events are destroyed after use");
}

#[test]
fn oom_path_waits_on_pending_events_then_retries() {
    let (dev, alloc, [main, side]) = sim(64 << 20);
    let a = alloc.alloc(40 << 20, main, Tag::KvCache).unwrap();
    a.record_stream(side).unwrap();
    dev.submit_work(side);
    drop(a);
    // Only 24 MiB of device memory is free; the 40 MiB block is pending on side.
    let b = alloc
        .alloc(40 << 20, main, Tag::KvCache)
        .expect("the OOM path waits for side and reuses the block");
    assert_eq!(alloc.stats().oom_retries, 1);
    assert_eq!(alloc.stats().device_allocs, 1);
    drop(b);
}

#[test]
fn oom_path_flushes_other_streams_cache() {
    let (_dev, alloc, [main, side]) = sim(64 << 20);
    drop(alloc.alloc(40 << 20, side, Tag::Other).unwrap());
    let a = alloc
        .alloc(40 << 20, main, Tag::Other)
        .expect("idle side segment released, then retried");
    let st = alloc.stats();
    assert_eq!(
        (st.device_allocs, st.device_frees, st.oom_retries),
        (2, 1, 1)
    );
    drop(a);
}

#[test]
fn device_failure_reports_breakdown() {
    let (dev, alloc, [main, _]) = sim(1 << 30);
    let _w = alloc.alloc(100 << 20, main, Tag::Weights).unwrap();
    let _k = alloc.alloc(30 << 20, main, Tag::KvCache).unwrap();
    dev.fail_next_mallocs(2);
    let err = alloc.alloc(50 << 20, main, Tag::Activations).unwrap_err();
    let AllocError::OutOfMemory(r) = err else {
        panic!("expected OOM")
    };
    assert_eq!(r.cause, OomCause::Device);
    assert_eq!(
        r.per_tag,
        vec![(Tag::Weights, 100 << 20), (Tag::KvCache, 30 << 20)]
    );
    assert_eq!(r.device_free, Some((1 << 30) - (130 << 20)));
    assert!(r.hint.contains("weights holds the most"), "{}", r.hint);
    // Injection exhausted: the same request now succeeds.
    alloc.alloc(50 << 20, main, Tag::Activations).unwrap();
}

#[test]
fn graph_capture_uses_private_pool_until_graph_dropped() {
    let (dev, alloc, [main, side]) = sim(1 << 30);
    let warm = alloc.alloc(1 << 16, main, Tag::Activations).unwrap();
    let warm_addr = warm.ptr();
    drop(warm);
    let pool = alloc.new_graph_pool();
    let cap = alloc
        .begin_capture(main, CaptureTarget::Private(&pool))
        .unwrap();
    assert!(matches!(
        alloc.begin_capture(main, CaptureTarget::StreamPool),
        Err(AllocError::AlreadyCapturing(_))
    ));
    let g = alloc.alloc(1 << 16, main, Tag::Graph).unwrap();
    assert_ne!(
        g.ptr(),
        warm_addr,
        "capture does not take from the stream's cache"
    );
    let other = alloc.alloc(1 << 16, side, Tag::Other).unwrap();
    let g_addr = g.ptr();
    drop(g);
    let g2 = alloc.alloc(1 << 16, main, Tag::Graph).unwrap();
    assert_eq!(
        g2.ptr(),
        g_addr,
        "frees inside the capture return to the graph's pool"
    );
    drop(g2);
    cap.end();
    let snap = alloc.snapshot();
    assert!(snap
        .segments
        .iter()
        .any(|s| s.pool == PoolName::Graph(pool.id())));
    // After capture, ordinary allocations never get graph memory.
    let after = alloc.alloc(1 << 16, main, Tag::Activations).unwrap();
    assert_eq!(after.ptr(), warm_addr);
    drop(after);
    let before = dev.stats().live;
    alloc.clear_cache().unwrap();
    assert!(
        alloc
            .snapshot()
            .segments
            .iter()
            .any(|s| s.pool == PoolName::Graph(pool.id())),
        "clear_cache keeps graph pools"
    );
    let live_before_drop = dev.stats().live;
    assert!(live_before_drop < before);
    drop(pool);
    assert!(
        alloc
            .snapshot()
            .segments
            .iter()
            .all(|s| s.pool == PoolName::Stream),
        "pool released with its graph"
    );
    assert_eq!(dev.stats().live, live_before_drop - 1);
    drop(other);
}

#[test]
fn graph_pool_live_block_freed_after_pool_dropped() {
    let (dev, alloc, [main, _]) = sim(1 << 30);
    let pool = alloc.new_graph_pool();
    let cap = alloc
        .begin_capture(main, CaptureTarget::Private(&pool))
        .unwrap();
    let g = alloc.alloc(5 << 20, main, Tag::Graph).unwrap();
    drop(cap);
    drop(pool);
    assert_eq!(dev.stats().live, 1, "still in use: kept");
    drop(g);
    assert_eq!(
        dev.stats().live,
        0,
        "returned as soon as its last block is freed"
    );
    assert_eq!(alloc.stats().reserved_bytes, 0);
}

#[test]
fn capture_can_use_the_stream_pool() {
    let (_dev, alloc, [main, _]) = sim(1 << 30);
    let warm = alloc.alloc(1 << 16, main, Tag::Activations).unwrap();
    let addr = warm.ptr();
    drop(warm);
    let cap = alloc
        .begin_capture(main, CaptureTarget::StreamPool)
        .unwrap();
    let g = alloc.alloc(1 << 16, main, Tag::Graph).unwrap();
    assert_eq!(g.ptr(), addr);
    drop(cap);
}

#[test]
fn decode_arena_keeps_addresses_and_high_water() {
    let (_dev, alloc, [main, _]) = sim(1 << 30);
    let mut arena = alloc.new_arena(1 << 20, main, Tag::Activations).unwrap();
    assert_eq!(alloc.stats().tag(Tag::Activations).current, 1 << 20);
    let step = |arena: &mut rocm_alloc::DecodeArena| -> Vec<u64> {
        [1000u64, 4096, 77, 65536]
            .iter()
            .map(|&n| arena.alloc(n).unwrap().ptr)
            .collect()
    };
    let first = step(&mut arena);
    assert!(first.iter().all(|p| p % rocm_alloc::ARENA_ALIGN == 0));
    assert_eq!(
        first[1] - first[0],
        1024,
        "1000 bytes rounded to the 256-byte alignment"
    );
    let used = arena.used();
    arena.reset();
    assert_eq!(arena.used(), 0);
    let second = step(&mut arena);
    assert_eq!(first, second, "same sequence, same addresses");
    assert_eq!(arena.high_water(), used);
    arena.reset();
    let err = arena.alloc(2 << 20).unwrap_err();
    assert!(matches!(err, AllocError::ArenaExhausted { high_water, .. } if high_water == 2 << 20));
    assert!(err.to_string().contains("high-water"), "{err}");
    assert_eq!(arena.used(), 0, "a refused request takes nothing");
    assert_eq!(arena.steps(), 2);
    drop(arena);
    assert_eq!(alloc.stats().active_bytes, 0);
}

#[test]
fn explicit_trim_enforces_cache_limit_lru_first() {
    let (_dev, alloc, [main, _]) = sim(1 << 30);
    alloc.set_cache_limit(LimitSpec::Bytes(25 << 20)).unwrap();
    let a = alloc.alloc(20 << 20, main, Tag::Other).unwrap();
    let b = alloc.alloc(12 << 20, main, Tag::Other).unwrap();
    let (pa, pb) = (a.ptr(), b.ptr());
    drop(a); // oldest
    drop(b);
    assert_eq!(alloc.stats().releasable_bytes, 32 << 20);
    let released = alloc.trim().unwrap();
    assert_eq!(released, 20 << 20, "least recently used first");
    let st = alloc.stats();
    assert!(st.releasable_bytes <= 25 << 20);
    let again = alloc.alloc(12 << 20, main, Tag::Other).unwrap();
    assert_eq!(again.ptr(), pb);
    assert_ne!(pa, pb);
}

#[test]
fn steady_loop_does_not_churn_under_small_cache_limit() {
    let (dev, alloc, [main, _]) = sim(4 << 30);
    alloc.set_cache_limit(LimitSpec::Bytes(1 << 20)).unwrap();
    // Phases that never overlap: a small-pool buffer, then a large one, then a huge one.
    let step = || {
        drop(alloc.alloc(300 << 10, main, Tag::Activations).unwrap());
        drop(alloc.alloc(6 << 20, main, Tag::Activations).unwrap());
        drop(alloc.alloc(64 << 20, main, Tag::Workspace).unwrap());
    };
    step();
    let warm = dev.stats().mallocs;
    for _ in 0..200 {
        step();
    }
    assert_eq!(
        dev.stats().mallocs,
        warm,
        "no device allocation after warm-up"
    );
    assert_eq!(dev.stats().frees, 0);
    // An explicit trim still enforces the limit.
    alloc.trim().unwrap();
    assert!(alloc.stats().releasable_bytes <= 1 << 20);
}

#[test]
fn stale_spike_is_trimmed_on_a_later_miss() {
    let d = Arc::new(SimDevice::discrete(4 << 30));
    let config = AllocatorConfig {
        read_env: false,
        cache_limit: Some(LimitSpec::Bytes(8 << 20)),
        trim_hot_window: 10,
        ..Default::default()
    };
    let alloc = Allocator::new(d.clone(), config).unwrap();
    let (main, side) = (d.create_stream(), d.create_stream());
    drop(alloc.alloc(512 << 20, main, Tag::Activations).unwrap()); // prefill spike
    for _ in 0..20 {
        drop(alloc.alloc(4096, main, Tag::Activations).unwrap());
    }
    // A miss (on another stream, so the spike's free block cannot serve it).
    let _miss = alloc.alloc(30 << 20, side, Tag::KvCache).unwrap();
    assert!(
        alloc.stats().releasable_bytes <= 8 << 20,
        "the cold spike segment was released before growing"
    );
    assert_eq!(d.stats().frees, 1);
}

#[test]
fn memory_limit_always_holds_and_lowering_it_is_checked() {
    let (_dev, alloc, [main, _]) = sim(8 << 30);
    alloc.set_memory_limit(LimitSpec::Bytes(100 << 20)).unwrap();
    let a = alloc.alloc(60 << 20, main, Tag::Weights).unwrap();
    let b = alloc.alloc(20 << 20, main, Tag::Other).unwrap();
    drop(b);
    alloc
        .set_memory_limit(LimitSpec::Bytes(70 << 20))
        .expect("idle segment released to fit");
    assert_eq!(alloc.stats().reserved_bytes, 60 << 20);
    let err = alloc
        .set_memory_limit(LimitSpec::Bytes(50 << 20))
        .unwrap_err();
    assert!(
        matches!(err, AllocError::LimitBelowReserved { .. }),
        "{err}"
    );
    assert_eq!(
        alloc.memory_limit(),
        Some(70 << 20),
        "a refused limit leaves the old one"
    );
    alloc.set_memory_limit(LimitSpec::Unbounded).unwrap();
    assert_eq!(alloc.memory_limit(), None);
    drop(a);
}

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

#[test]
fn defaults_are_bounded() {
    let d = Arc::new(SimDevice::discrete(80 << 30));
    let alloc = Allocator::with_env_lookup(d, AllocatorConfig::default(), &env(&[])).unwrap();
    assert_eq!(
        alloc.memory_limit(),
        Some(72 << 30),
        "90% of a discrete device"
    );
    assert_eq!(alloc.cache_limit(), Some(CACHE_FLOOR));
    alloc.set_weight_bytes(8 << 30);
    assert_eq!(
        alloc.cache_limit(),
        Some(limits::default_cache_limit(8 << 30))
    );
    assert!(alloc.cache_limit().unwrap() > CACHE_FLOOR);
}

#[test]
fn uma_default_uses_carve_out_gtt_and_host_ram() {
    let uma = UmaInfo {
        carve_out: 512 << 20,
        gtt: 64 << 30,
        host_ram: 64 << 30,
    };
    let d = Arc::new(SimDevice::new(SimConfig::uma(uma)));
    let alloc = Allocator::with_env_lookup(d, AllocatorConfig::default(), &env(&[])).unwrap();
    // 64 GiB RAM keeps max(4 GiB, 16 GiB) = 16 GiB for the host.
    assert_eq!(
        alloc.memory_limit(),
        Some(((512u64 << 20) * 9 / 10) + (48 << 30))
    );
}

#[test]
fn env_overrides_and_explicit_values_win() {
    let d = Arc::new(SimDevice::discrete(80 << 30));
    let e = env(&[
        ("HIPDECODE_MEMORY_LIMIT", "50%"),
        ("HIPDECODE_CACHE_LIMIT", "1.5GiB"),
    ]);
    let alloc = Allocator::with_env_lookup(d.clone(), AllocatorConfig::default(), &e).unwrap();
    assert_eq!(alloc.memory_limit(), Some(40 << 30));
    assert_eq!(alloc.cache_limit(), Some(3 << 29));
    alloc.set_weight_bytes(64 << 30);
    assert_eq!(
        alloc.cache_limit(),
        Some(3 << 29),
        "weight reports never override an explicit limit"
    );
    let e = env(&[
        ("HIPDECODE_MEMORY_LIMIT", "none"),
        ("HIPDECODE_CACHE_LIMIT", "0"),
    ]);
    let alloc = Allocator::with_env_lookup(d.clone(), AllocatorConfig::default(), &e).unwrap();
    assert_eq!((alloc.memory_limit(), alloc.cache_limit()), (None, None));
    let config = AllocatorConfig {
        memory_limit: Some(LimitSpec::Bytes(1 << 30)),
        ..Default::default()
    };
    let e = env(&[("HIPDECODE_MEMORY_LIMIT", "50%")]);
    let alloc = Allocator::with_env_lookup(d, config, &e).unwrap();
    assert_eq!(
        alloc.memory_limit(),
        Some(1 << 30),
        "configuration beats the environment"
    );
}

#[test]
fn bad_env_value_is_an_error_naming_it() {
    let d = Arc::new(SimDevice::discrete(1 << 30));
    let e = env(&[("HIPDECODE_CACHE_LIMIT", "12 parsecs")]);
    let err = Allocator::with_env_lookup(d, AllocatorConfig::default(), &e).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, AllocError::Limit(_)));
    assert!(
        msg.contains("HIPDECODE_CACHE_LIMIT") && msg.contains("12 parsecs") && msg.contains("GiB"),
        "{msg}"
    );
}

#[test]
fn tags_account_separately() {
    let (_dev, alloc, [main, side]) = sim(1 << 30);
    let w = alloc.alloc(3 << 20, main, Tag::Weights).unwrap();
    let k = alloc.alloc(1 << 20, main, Tag::KvCache).unwrap();
    let x = alloc.alloc(1000, side, Tag::Activations).unwrap();
    let st = alloc.stats();
    assert_eq!(st.tag(Tag::Weights).current, 3 << 20);
    assert_eq!(st.tag(Tag::KvCache).current, 1 << 20);
    assert_eq!(st.tag(Tag::Activations).current, 1024);
    let sum: u64 = st.per_tag.iter().map(|(_, u)| u.current).sum();
    assert_eq!(sum, st.active_bytes);
    drop((w, k, x));
}

#[test]
fn allocator_and_handles_are_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Allocator>();
    check::<rocm_alloc::Allocation>();
    check::<rocm_alloc::GraphPool>();
}
