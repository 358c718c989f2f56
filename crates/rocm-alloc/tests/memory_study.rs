//! The memory study's reports on the simulated device: the snapshot's stranded list (a side
//! stream's cache, a retired stream), the partition of reserved bytes, the arena counter and
//! the trim-window variable.

mod common;

use std::sync::Arc;

use rocm_alloc::devices::sim::SimDevice;
use rocm_alloc::{
    AllocError, Allocator, AllocatorConfig, BlockState, CaptureTarget, LimitSpec, PoolName,
    StrandedReason, StreamId, Tag,
};

const TRIM_WINDOW_ENV: &str = rocm_alloc::knobs::TRIM_WINDOW.name;

fn sim() -> (Arc<SimDevice>, Allocator, [StreamId; 2]) {
    let d = Arc::new(SimDevice::discrete(1 << 30));
    let a = common::allocator(d.clone());
    let streams = [d.create_stream(), d.create_stream()];
    (d, a, streams)
}

#[test]
fn a_side_streams_cache_is_reported_as_stranded_with_size_and_stream() {
    let (_dev, alloc, [main, side]) = sim();
    let keep = alloc.alloc(4096, main, Tag::Weights).unwrap();
    // A side stream used 3 MiB and freed it: the bytes stay cached in the side stream's pool,
    // where the main stream can never reuse them.
    drop(alloc.alloc(3 << 20, side, Tag::Activations).unwrap());
    assert!(
        alloc.snapshot().stranded.is_empty(),
        "nothing is stranded before a main stream is named"
    );
    alloc.set_main_stream(main);
    let snap = alloc.snapshot();
    assert_eq!(snap.main_stream, Some(main));
    assert!(
        !snap.stranded.is_empty(),
        "the side stream's cache is listed"
    );
    assert!(snap.stranded.iter().all(|b| b.stream == side
        && b.reason == StrandedReason::SideStreamCache
        && b.state == BlockState::Free));
    let side_reserved: u64 = snap
        .segments
        .iter()
        .filter(|s| s.stream == side)
        .map(|s| s.size)
        .sum();
    assert_eq!(snap.stranded_bytes_by_stream(), vec![(side, side_reserved)]);
    let text = snap.stranded_report();
    assert!(
        text.contains(&format!("on stream {}", side.value())),
        "{text}"
    );
    assert!(snap.to_json().contains("\"stranded\""));
    // The main stream's own free space is not stranded.
    assert!(snap.stranded.iter().all(|b| b.stream != main));
    drop(keep);
}

#[test]
fn every_block_of_a_retired_stream_is_stranded_active_ones_too() {
    let (_dev, alloc, [main, side]) = sim();
    let held = alloc.alloc(8192, side, Tag::Workspace).unwrap();
    alloc.retire_stream(side);
    let snap = alloc.snapshot();
    let active: Vec<_> = snap
        .stranded
        .iter()
        .filter(|b| b.state == BlockState::Active)
        .collect();
    assert_eq!(active.len(), 1);
    assert_eq!(active[0].address, held.ptr());
    assert_eq!(active[0].tag, Some(Tag::Workspace));
    assert_eq!(active[0].reason, StrandedReason::RetiredStream);
    assert!(snap.stranded.iter().all(|b| b.stream == side));
    let _ = main;
}

#[test]
fn the_breakdown_partitions_reserved_bytes_exactly() {
    let (_dev, alloc, [main, side]) = sim();
    // No cache limit, so that the idle segment below outlives the trim at the capture's end
    // (the 4 MiB default would release it).
    alloc.set_cache_limit(LimitSpec::Unbounded).unwrap();
    let w = alloc.alloc(5 << 20, main, Tag::Weights).unwrap();
    let kv = alloc.alloc(12 << 20, main, Tag::KvCache).unwrap();
    // Two small blocks in one 2 MiB segment; freeing one leaves slack beside the other.
    let a = alloc.alloc(4096, main, Tag::Activations).unwrap();
    let b = alloc.alloc(4096, main, Tag::Activations).unwrap();
    drop(b);
    // An idle segment: releasable cache.
    drop(alloc.alloc(40 << 20, main, Tag::Workspace).unwrap());
    // A pending free: used by the side stream, whose work has not completed.
    let p = alloc.alloc(1 << 20, main, Tag::Activations).unwrap();
    p.record_stream(side).unwrap();
    _dev.submit_work(side);
    drop(p);
    // A graph pool with one block.
    let pool = alloc.new_graph_pool();
    let guard = alloc
        .begin_capture(main, CaptureTarget::Private(&pool))
        .unwrap();
    let g = alloc.alloc(4096, main, Tag::Graph).unwrap();
    drop(guard);
    let arena = alloc.new_arena(1 << 20, main, Tag::Activations).unwrap();

    let snap = alloc.snapshot();
    let br = snap.breakdown();
    assert_eq!(br.reserved, snap.stats.reserved_bytes);
    assert_eq!(br.sum(), br.reserved, "{br:?}");
    assert_eq!(br.active(Tag::Weights), w.block_size());
    assert_eq!(br.active(Tag::KvCache), kv.block_size());
    assert_eq!(br.releasable, 40 << 20);
    assert!(br.fragmentation > 0, "{br:?}");
    assert_eq!(br.pending, 1 << 20);
    let graph_segments: u64 = snap
        .segments
        .iter()
        .filter(|s| matches!(s.pool, PoolName::Graph(_)))
        .map(|s| s.size)
        .sum();
    assert_eq!(br.graph_pools, graph_segments);
    assert!(br.graph_pools >= g.block_size());
    assert_eq!(br.arena, 1 << 20);
    assert_eq!(snap.stats.arena_bytes, 1 << 20);
    drop(arena);
    assert_eq!(
        alloc.stats().arena_bytes,
        0,
        "a dropped arena leaves the count"
    );
    drop((w, kv, a, g));
}

fn with_env(vars: &'static [(&'static str, &'static str)]) -> Result<Allocator, AllocError> {
    let d = Arc::new(SimDevice::discrete(1 << 30));
    let env = knobs::Env::from_pairs(vars.iter().copied());
    Allocator::with_env(d, AllocatorConfig::default(), &env)
}

#[test]
fn the_trim_window_variable_is_read_and_a_bad_value_refused() {
    assert!(with_env(&[(TRIM_WINDOW_ENV, "0")]).is_ok());
    let e = with_env(&[(TRIM_WINDOW_ENV, "soon")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(TRIM_WINDOW_ENV) && e.contains("whole number"),
        "{e}"
    );
    // A window of 0 spares nothing: the idle segment goes back at the next miss even though
    // it was just used, where the default window keeps it.
    for (vars, expect_release) in [
        (
            &[(TRIM_WINDOW_ENV, "0"), ("HIPDECODE_CACHE_LIMIT", "1MiB")][..],
            true,
        ),
        (&[("HIPDECODE_CACHE_LIMIT", "1MiB")][..], false),
    ] {
        let vars: &'static [(&'static str, &'static str)] =
            Box::leak(vars.to_vec().into_boxed_slice());
        let alloc = with_env(vars).unwrap();
        drop(
            alloc
                .alloc(30 << 20, StreamId::DEFAULT, Tag::Activations)
                .unwrap(),
        );
        // One more allocation, so the 30 MiB segment is no longer the latest one used.
        let _s = alloc
            .alloc(4096, StreamId::DEFAULT, Tag::Activations)
            .unwrap();
        let _b = alloc
            .alloc(40 << 20, StreamId::DEFAULT, Tag::Activations)
            .unwrap();
        let released = alloc.stats().device_frees > 0;
        assert_eq!(released, expect_release, "{vars:?}");
    }
}
