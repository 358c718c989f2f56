//! Behaviour that needs the simulated device's control over streams, failures and memory
//! layout: deferred cross-stream frees, graph pools, the decode arena, the OOM path, trimming,
//! limits and their environment overrides.

mod common;

use std::sync::Arc;

use rocm_alloc::devices::sim::{EventFaults, SimConfig, SimDevice};
use rocm_alloc::limits::DEFAULT_CACHE_LIMIT;
use rocm_alloc::{
    AllocError, Allocator, AllocatorConfig, BlockState, CaptureTarget, DeviceError, LimitSpec,
    OomCause, PoolName, StreamId, Tag, UmaInfo,
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

fn env(pairs: &[(&str, &str)]) -> knobs::Env {
    knobs::Env::from_pairs(pairs.iter().copied())
}

#[test]
fn defaults_are_bounded() {
    let d = Arc::new(SimDevice::discrete(80 << 30));
    let alloc = Allocator::with_env(d, AllocatorConfig::default(), &env(&[])).unwrap();
    assert_eq!(
        alloc.memory_limit(),
        Some(72 << 30),
        "90% of a discrete device"
    );
    assert_eq!(alloc.cache_limit(), Some(4 << 20), "the measured 4 MiB");
    assert_eq!(alloc.cache_limit(), Some(DEFAULT_CACHE_LIMIT));
}

#[test]
fn uma_default_uses_carve_out_gtt_and_host_ram() {
    let uma = UmaInfo {
        carve_out: 512 << 20,
        gtt: 64 << 30,
        host_ram: 64 << 30,
    };
    let d = Arc::new(SimDevice::new(SimConfig::uma(uma)));
    let alloc = Allocator::with_env(d, AllocatorConfig::default(), &env(&[])).unwrap();
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
    let alloc = Allocator::with_env(d.clone(), AllocatorConfig::default(), &e).unwrap();
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
    let alloc = Allocator::with_env(d.clone(), AllocatorConfig::default(), &e).unwrap();
    assert_eq!((alloc.memory_limit(), alloc.cache_limit()), (None, None));
    let config = AllocatorConfig {
        memory_limit: Some(LimitSpec::Bytes(1 << 30)),
        ..Default::default()
    };
    let e = env(&[("HIPDECODE_MEMORY_LIMIT", "50%")]);
    let alloc = Allocator::with_env(d, config, &e).unwrap();
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
    let err = Allocator::with_env(d, AllocatorConfig::default(), &e).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, AllocError::Knob(_)));
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

fn allocator_with(dev: &Arc<SimDevice>, config: AllocatorConfig) -> Allocator {
    Allocator::new(
        dev.clone(),
        AllocatorConfig {
            read_env: false,
            ..config
        },
    )
    .unwrap()
}

#[test]
fn failed_event_query_loses_no_block_and_is_reported_once() {
    let (dev, alloc, [main, side]) = sim(1 << 30);
    let bad = dev.create_stream();
    let a = alloc.alloc(4096, main, Tag::Activations).unwrap();
    let b = alloc.alloc(4096, main, Tag::Activations).unwrap();
    let (pa, pb) = (a.ptr(), b.ptr());
    a.record_stream(side).unwrap();
    b.record_stream(bad).unwrap();
    dev.submit_work(side);
    dev.submit_work(bad);
    drop(a); // pending on `side`, polled first
    drop(b); // pending on `bad`, whose event queries fail
    dev.complete_stream(side);
    dev.set_event_faults(
        bad,
        EventFaults {
            query: true,
            ..Default::default()
        },
    );
    let c = alloc
        .alloc(4096, main, Tag::Activations)
        .expect("a failed event query does not fail allocations");
    assert_eq!(c.ptr(), pa, "the block whose event completed was released");
    let failures = alloc.take_event_failures();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(
        (
            failures[0].address,
            failures[0].stream,
            failures[0].event_stream
        ),
        (pb, main, bad),
        "the report names the block and both streams"
    );
    assert!(failures[0].error.contains("injected"), "{failures:?}");
    for _ in 0..3 {
        let d = alloc.alloc(4096, main, Tag::Activations).unwrap();
        assert_ne!(d.ptr(), pb, "a stuck block is never reused");
    }
    assert!(alloc.take_event_failures().is_empty(), "reported once");
    let snap = alloc.snapshot();
    assert_eq!(snap.stats.stuck_blocks, 1);
    assert_eq!(snap.stuck_blocks.len(), 1);
    assert_eq!(snap.stuck_blocks[0].address, pb);
    assert_eq!(alloc.process_pending().unwrap(), 1, "only the stuck block");
    assert_eq!(
        dev.stats().live_events,
        0,
        "the failed entry's events are destroyed"
    );
}

#[test]
fn failed_event_wait_on_the_oom_path_gives_an_oom_report() {
    let (dev, alloc, [main, _]) = sim(64 << 20);
    let bad = dev.create_stream();
    let a = alloc.alloc(40 << 20, main, Tag::KvCache).unwrap();
    a.record_stream(bad).unwrap();
    dev.submit_work(bad);
    drop(a);
    dev.set_event_faults(
        bad,
        EventFaults {
            query: false,
            wait: true,
            record: false,
        },
    );
    // Polling says "not done"; the OOM path then waits, and the wait fails.
    let err = alloc.alloc(40 << 20, main, Tag::KvCache).unwrap_err();
    assert!(matches!(err, AllocError::OutOfMemory(_)), "{err}");
    let failures = alloc.take_event_failures();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].event_stream, bad);
    // The allocator stays usable for what fits.
    alloc.alloc(1 << 20, main, Tag::KvCache).unwrap();
}

#[test]
fn failed_event_record_at_free_is_reported_and_the_block_kept() {
    let (dev, alloc, [main, side]) = sim(1 << 30);
    let a = alloc.alloc(4096, main, Tag::Activations).unwrap();
    let pa = a.ptr();
    a.record_stream(side).unwrap();
    dev.set_event_faults(
        side,
        EventFaults {
            record: true,
            ..Default::default()
        },
    );
    drop(a);
    let failures = alloc.take_event_failures();
    assert_eq!(failures.len(), 1);
    assert_eq!((failures[0].address, failures[0].event_stream), (pa, side));
    let b = alloc.alloc(4096, main, Tag::Activations).unwrap();
    assert_ne!(b.ptr(), pa);
}

#[test]
fn capture_makes_no_illegal_call_and_defers_frees_to_its_end() {
    let dev = Arc::new(SimDevice::discrete(1 << 30));
    let alloc = allocator_with(
        &dev,
        AllocatorConfig {
            cache_limit: Some(LimitSpec::Bytes(1 << 20)),
            memory_limit: Some(LimitSpec::Bytes(64 << 20)),
            trim_hot_window: 0,
            ..Default::default()
        },
    );
    let (main, side) = (dev.create_stream(), dev.create_stream());
    // Before the capture: a block of `side` also used by `main`, still live; one already
    // freed and pending on `main`'s unfinished work; an idle 12 MiB segment (over the cache
    // limit); and a graph pool with an idle segment whose graph is about to go.
    let shared = alloc.alloc(4096, side, Tag::Activations).unwrap();
    shared.record_stream(main).unwrap();
    let pending = alloc.alloc(8192, side, Tag::Activations).unwrap();
    pending.record_stream(main).unwrap();
    dev.submit_work(main);
    drop(pending);
    let old_pool = alloc.new_graph_pool();
    {
        let _g = alloc
            .begin_capture(side, CaptureTarget::Private(&old_pool))
            .unwrap();
        drop(alloc.alloc(4096, side, Tag::Graph).unwrap());
    }
    // (On `main`'s ordinary pool, which serves nothing while `main` captures.)
    drop(alloc.alloc(12 << 20, main, Tag::Workspace).unwrap());
    let frees_before = dev.stats().frees;
    let reserved_before = alloc.stats().reserved_bytes;

    let pool = alloc.new_graph_pool();
    let guard = alloc
        .begin_capture(main, CaptureTarget::Private(&pool))
        .unwrap();
    dev.begin_capture(main);

    let g = alloc.alloc(1 << 16, main, Tag::Graph).unwrap();
    drop(shared); // freed across streams during the capture
    let t = alloc.alloc(4096, main, Tag::Graph).unwrap();
    t.record_stream(side).unwrap();
    drop(t);
    // A miss on another stream with the cache over its limit: no trim now.
    let grown = alloc.alloc(3 << 20, side, Tag::Workspace).unwrap();
    assert_eq!(dev.capture_violations(), Vec::<String>::new());
    // Out of memory under capture: reported at once, without flushing or waiting.
    let err = alloc.alloc(60 << 20, side, Tag::Workspace).unwrap_err();
    let AllocError::OutOfMemory(report) = &err else {
        panic!("expected OOM, got {err}")
    };
    assert!(report.capture_active);
    assert_eq!(report.cause, OomCause::MemoryLimit);
    assert!(err.to_string().contains("graph capture is active"), "{err}");
    drop(old_pool); // its idle segment must wait for the capture's end
    assert!(matches!(
        alloc.trim(),
        Err(AllocError::CaptureActive { .. })
    ));
    assert!(matches!(
        alloc.clear_cache(),
        Err(AllocError::CaptureActive { .. })
    ));
    alloc.set_cache_limit(LimitSpec::Bytes(1 << 20)).unwrap();
    assert_eq!(
        alloc.process_pending().unwrap(),
        3,
        "nothing polled, all held"
    );

    assert_eq!(dev.capture_violations(), Vec::<String>::new());
    assert_eq!(
        dev.stats().frees,
        frees_before,
        "no device free during capture"
    );
    assert!(alloc.stats().reserved_bytes > reserved_before);

    dev.end_capture(main);
    drop(guard);
    assert_eq!(dev.capture_violations(), Vec::<String>::new());
    // The deferred frees now wait on real events; the idle segments above the cache limit
    // (the 12 MiB one, the dead graph pool's) are gone.
    let st = alloc.stats();
    assert!(st.releasable_bytes <= 1 << 20, "{st:?}");
    assert!(dev.stats().frees >= frees_before + 2);
    assert_eq!(
        dev.stats().live_events,
        3,
        "events for `pending`, `shared` and `t`"
    );
    assert_eq!(
        alloc.process_pending().unwrap(),
        2,
        "`t` waited on idle `side`; the two blocks used by `main` wait for its work"
    );
    dev.complete_all();
    assert_eq!(alloc.process_pending().unwrap(), 0);
    drop((g, grown, pool));
    alloc.clear_cache().unwrap();
    assert_eq!(dev.stats().live, 0);
    assert_eq!(dev.capture_violations(), Vec::<String>::new());
}

#[test]
fn best_fit_finds_a_block_behind_many_smaller_ones() {
    // Memory for exactly one small segment: a missed fit cannot be hidden by growing.
    let dev = Arc::new(SimDevice::discrete(1 << 30));
    let alloc = allocator_with(
        &dev,
        AllocatorConfig {
            memory_limit: Some(LimitSpec::Bytes(2 << 20)),
            ..Default::default()
        },
    );
    let s = dev.create_stream();
    let fit = 71 * 512; // same size class as the 64-unit blocks below
    let mut free_later = vec![alloc.alloc(fit, s, Tag::Other).unwrap()];
    let mut keep = vec![alloc.alloc(512, s, Tag::Other).unwrap()];
    for _ in 0..17 {
        free_later.push(alloc.alloc(64 * 512, s, Tag::Other).unwrap());
        keep.push(alloc.alloc(512, s, Tag::Other).unwrap());
    }
    // Use up the rest of the segment so that no larger free block exists.
    let used: u64 = free_later.iter().chain(&keep).map(|a| a.block_size()).sum();
    keep.push(alloc.alloc(1 << 20, s, Tag::Other).unwrap());
    keep.push(
        alloc
            .alloc((2 << 20) - used - (1 << 20), s, Tag::Other)
            .unwrap(),
    );
    assert_eq!(dev.stats().mallocs, 1);
    let fit_addr = free_later[0].ptr();
    // The fitting block is freed first, then 17 smaller ones of its class.
    for a in free_later {
        drop(a);
    }
    let again = alloc
        .alloc(fit, s, Tag::Other)
        .expect("the fitting free block is found: no out-of-memory while it exists");
    assert_eq!(again.ptr(), fit_addr);
    assert_eq!(dev.stats().mallocs, 1, "served from the cache");
    assert_eq!(alloc.stats().oom_retries, 0);
}

#[test]
fn unknown_streams_are_errors_not_leaks() {
    let (_dev, alloc, [main, _]) = sim(1 << 30);
    let foreign = SimDevice::discrete(1 << 30).create_stream();
    let err = alloc.alloc(4096, foreign, Tag::Other).unwrap_err();
    assert!(
        matches!(err, AllocError::Device(DeviceError::UnknownStream { stream, .. }) if stream == foreign),
        "{err}"
    );
    assert!(err.to_string().contains("create_stream"), "{err}");
    assert!(alloc
        .begin_capture(foreign, CaptureTarget::StreamPool)
        .is_err());
    let a = alloc.alloc(4096, main, Tag::Other).unwrap();
    let pa = a.ptr();
    assert!(matches!(
        a.record_stream(foreign),
        Err(AllocError::Device(DeviceError::UnknownStream { .. }))
    ));
    drop(a);
    let st = alloc.stats();
    assert_eq!(
        st.pending_free_blocks, 0,
        "the refused use does not hold the block"
    );
    assert_eq!(alloc.alloc(4096, main, Tag::Other).unwrap().ptr(), pa);
}

#[test]
fn fraction_limits_are_range_checked() {
    let (_dev, alloc, _) = sim(1 << 30);
    let before = alloc.cache_limit();
    for bad in [f64::NAN, 0.0, -1.0, 1.5] {
        let e = alloc
            .set_cache_limit(LimitSpec::FractionOfDevice(bad))
            .unwrap_err();
        assert!(matches!(e, AllocError::InvalidLimit(_)), "{e}");
        assert!(e.to_string().contains("at most 1"), "{e}");
        assert!(alloc
            .set_memory_limit(LimitSpec::FractionOfDevice(bad))
            .is_err());
    }
    assert_eq!(
        alloc.cache_limit(),
        before,
        "a refused limit changes nothing"
    );
    let dev = Arc::new(SimDevice::discrete(1 << 30));
    let err = Allocator::new(
        dev,
        AllocatorConfig {
            read_env: false,
            memory_limit: Some(LimitSpec::FractionOfDevice(f64::NAN)),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, AllocError::InvalidLimit(_)), "{err}");
    alloc
        .set_cache_limit(LimitSpec::FractionOfDevice(0.5))
        .unwrap();
    assert_eq!(alloc.cache_limit(), Some(512 << 20));
}

#[test]
fn a_weight_report_leaves_the_default_cache_limit_as_it_is() {
    let (dev, alloc, [main, _]) = sim(4 << 30);
    drop(alloc.alloc(4096, main, Tag::Activations).unwrap()); // an idle 2 MiB segment
    let cached = alloc.stats().releasable_bytes;
    assert!(cached > 0 && cached <= DEFAULT_CACHE_LIMIT, "{cached}");
    for weights in [8 << 30, 0, 100 << 30] {
        alloc.set_weight_bytes(weights);
        assert_eq!(alloc.cache_limit(), Some(DEFAULT_CACHE_LIMIT), "{weights}");
        assert_eq!(alloc.stats().releasable_bytes, cached, "nothing trimmed");
    }
    assert_eq!(dev.stats().frees, 0);
}

/// Under the default limit the cache keeps at most 4 MiB idle: a 64 MiB block freed after a
/// large model was reported goes back to the device at a trim, and at the next miss once it
/// is outside the hot window.
#[test]
fn the_default_cache_keeps_at_most_four_mebibytes() {
    let (dev, alloc, [main, _]) = sim(4 << 30);
    alloc.set_weight_bytes(8 << 30);
    drop(alloc.alloc(64 << 20, main, Tag::Activations).unwrap());
    assert_eq!(
        alloc.stats().releasable_bytes,
        64 << 20,
        "a free does not trim"
    );
    assert_eq!(alloc.trim().unwrap(), 64 << 20);
    assert_eq!(alloc.stats().releasable_bytes, 0);
    assert_eq!(dev.stats().frees, 1);

    // The automatic trim on a miss, with no hot window to spare the segment.
    let dev = Arc::new(SimDevice::discrete(4 << 30));
    let config = AllocatorConfig {
        read_env: false,
        trim_hot_window: 0,
        ..Default::default()
    };
    let alloc = Allocator::new(dev.clone(), config).unwrap();
    let main = dev.create_stream();
    alloc.set_weight_bytes(8 << 30);
    drop(alloc.alloc(64 << 20, main, Tag::Activations).unwrap());
    // One allocation later the idle 64 MiB is outside the window (the last one used is
    // always spared).
    let _small = alloc.alloc(4096, main, Tag::Activations).unwrap();
    assert_eq!(dev.stats().frees, 0);
    let _miss = alloc.alloc(128 << 20, main, Tag::Activations).unwrap();
    assert_eq!(alloc.stats().releasable_bytes, 0);
    assert_eq!(
        dev.stats().frees,
        1,
        "the idle 64 MiB went back before growing"
    );
}
