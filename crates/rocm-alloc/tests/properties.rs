//! Property tests on `SimDevice`: random sequences of allocations, frees, cross-stream uses,
//! stream progress, trims, limit changes and graph-capture pools, checked against a model after
//! every step.

use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use rocm_alloc::devices::sim::SimDevice;
use rocm_alloc::size_class::round_request;
use rocm_alloc::{
    AllocError, Allocation, Allocator, AllocatorConfig, BlockState, CaptureTarget, LimitSpec,
    StreamId, Tag,
};

const DEVICE: u64 = 512 << 20;
const MEMORY_LIMIT: u64 = 320 << 20;

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        size: u64,
        stream: usize,
        tag: usize,
    },
    Free {
        index: usize,
    },
    RecordStream {
        index: usize,
        stream: usize,
    },
    SubmitWork {
        stream: usize,
    },
    CompleteStream {
        stream: usize,
    },
    Trim,
    SetCacheLimit {
        bytes: u64,
    },
    ClearCache,
    ProcessPending,
    /// Start capturing on a stream into the current graph pool (making one if needed).
    BeginCapture {
        stream: usize,
    },
    EndCapture,
    /// Drop the graph pool (the "graph" goes away); blocks still held keep their segments.
    DropGraphPool,
}

fn size() -> impl Strategy<Value = u64> {
    // Log-uniform from 1 byte to 64 MiB, so every pool and segment kind is exercised.
    (0u32..27, any::<u64>()).prop_map(|(exp, r)| {
        let base = 1u64 << exp;
        base + r % base
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (size(), 0..3usize, 0..Tag::COUNT).prop_map(|(size, stream, tag)| Op::Alloc { size, stream, tag }),
        5 => any::<usize>().prop_map(|index| Op::Free { index }),
        2 => (any::<usize>(), 0..3usize).prop_map(|(index, stream)| Op::RecordStream { index, stream }),
        2 => (0..3usize).prop_map(|stream| Op::SubmitWork { stream }),
        2 => (0..3usize).prop_map(|stream| Op::CompleteStream { stream }),
        1 => Just(Op::Trim),
        1 => (0u64..(64 << 20)).prop_map(|bytes| Op::SetCacheLimit { bytes }),
        1 => Just(Op::ClearCache),
        1 => Just(Op::ProcessPending),
        1 => (0..3usize).prop_map(|stream| Op::BeginCapture { stream }),
        1 => Just(Op::EndCapture),
        1 => Just(Op::DropGraphPool),
    ]
}

/// A freed range that must not be handed out again until stream number `stream` has completed
/// the work submitted before the free (`target`).
struct Quarantine {
    addr: u64,
    size: u64,
    stream: usize,
    target: u64,
}

/// Per-stream work counters, mirroring what the simulated device does.
#[derive(Default, Clone, Copy)]
struct Work {
    submitted: u64,
    completed: u64,
}

/// The allocator waited on every pending event (OOM path, `clear_cache`): each stream has run
/// up to the work its quarantined blocks waited for.
fn waited_all(quarantine: &mut Vec<Quarantine>, work: &mut [Work; 3]) {
    for q in quarantine.drain(..) {
        let w = &mut work[q.stream];
        w.completed = w.completed.max(q.target);
    }
}

fn overlaps(a: u64, an: u64, b: u64, bn: u64) -> bool {
    a < b + bn && b < a + an
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dev = Arc::new(SimDevice::discrete(DEVICE));
    let config = AllocatorConfig {
        read_env: false,
        memory_limit: Some(LimitSpec::Bytes(MEMORY_LIMIT)),
        cache_limit: Some(LimitSpec::Bytes(16 << 20)),
        trim_hot_window: 8,
        ..Default::default()
    };
    let alloc = Allocator::new(dev.clone(), config).unwrap();
    let streams: [StreamId; 3] = [StreamId::DEFAULT, dev.create_stream(), dev.create_stream()];
    // Each live allocation with the numbers of the streams recorded on it.
    let mut live: Vec<(Allocation, Vec<usize>)> = Vec::new();
    let mut quarantine: Vec<Quarantine> = Vec::new();
    let mut work = [Work::default(); 3];
    let mut graph_pool: Option<rocm_alloc::GraphPool> = None;
    let mut capture: Option<rocm_alloc::CaptureGuard> = None;
    let index_of = |s: StreamId| streams.iter().position(|&x| x == s).unwrap();

    for op in ops {
        // The device is the truth about completion: an event wait by the allocator (on the OOM
        // path, in clear_cache, or for a free deferred past a capture, whose event the model
        // does not see) lets a stream run further than the model's own counters say.
        for (i, w) in work.iter_mut().enumerate() {
            w.completed = w.completed.max(dev.completed_work(streams[i]));
        }
        quarantine.retain(|q| work[q.stream].completed < q.target);
        match op {
            Op::Alloc { size, stream, tag } => {
                let retries = alloc.stats().oom_retries;
                match alloc.alloc(size, streams[stream], Tag::ALL[tag]) {
                    Ok(a) => {
                        if alloc.stats().oom_retries > retries {
                            waited_all(&mut quarantine, &mut work);
                        }
                        let n = a.block_size();
                        prop_assert!(n >= round_request(size).unwrap());
                        for q in &quarantine {
                            prop_assert!(
                                !overlaps(a.ptr(), n, q.addr, q.size),
                                "reused {:#x} before stream {:?} completed",
                                q.addr,
                                q.stream
                            );
                        }
                        for (other, _) in &live {
                            let m = other.block_size();
                            prop_assert!(
                                !overlaps(a.ptr(), n, other.ptr(), m),
                                "live blocks overlap"
                            );
                        }
                        live.push((a, Vec::new()));
                    }
                    Err(AllocError::OutOfMemory(r)) => {
                        prop_assert_eq!(r.capture_active, capture.is_some());
                        if capture.is_none() {
                            waited_all(&mut quarantine, &mut work);
                        }
                        prop_assert!(r.reserved <= MEMORY_LIMIT);
                        prop_assert_eq!(r.requested, size);
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("unexpected error {e}"))),
                }
            }
            Op::Free { index } => {
                if !live.is_empty() {
                    let (a, uses) = live.swap_remove(index % live.len());
                    for s in uses {
                        let w = work[s];
                        if w.submitted > w.completed && s != index_of(a.stream()) {
                            quarantine.push(Quarantine {
                                addr: a.ptr(),
                                size: a.block_size(),
                                stream: s,
                                target: w.submitted,
                            });
                        }
                    }
                    drop(a);
                }
            }
            Op::RecordStream { index, stream } => {
                if !live.is_empty() {
                    let i = index % live.len();
                    live[i].0.record_stream(streams[stream]).unwrap();
                    live[i].1.push(stream);
                }
            }
            Op::SubmitWork { stream } => {
                dev.submit_work(streams[stream]);
                work[stream].submitted += 1;
            }
            Op::CompleteStream { stream } => {
                dev.complete_stream(streams[stream]);
                work[stream].completed = work[stream].submitted;
                quarantine.retain(|q| q.stream != stream);
            }
            Op::Trim if capture.is_some() => {
                let refused = matches!(alloc.trim(), Err(AllocError::CaptureActive { .. }));
                prop_assert!(refused, "trim is refused during capture");
            }
            Op::Trim => {
                alloc.trim().unwrap();
                let st = alloc.stats();
                prop_assert!(
                    st.releasable_bytes <= st.cache_limit.unwrap_or(u64::MAX),
                    "trim enforces the cache limit"
                );
            }
            Op::SetCacheLimit { bytes } => {
                alloc
                    .set_cache_limit(LimitSpec::Bytes(bytes.max(1)))
                    .unwrap();
                if capture.is_none() {
                    prop_assert!(alloc.stats().releasable_bytes <= bytes.max(1));
                }
            }
            Op::ClearCache if capture.is_some() => {
                let refused = matches!(alloc.clear_cache(), Err(AllocError::CaptureActive { .. }));
                prop_assert!(refused, "clear_cache is refused during capture");
            }
            Op::ClearCache => {
                alloc.clear_cache().unwrap();
                waited_all(&mut quarantine, &mut work);
                prop_assert_eq!(alloc.stats().releasable_bytes, 0);
            }
            Op::BeginCapture { stream } => {
                if capture.is_none() {
                    let pool = graph_pool.get_or_insert_with(|| alloc.new_graph_pool());
                    capture = Some(
                        alloc
                            .begin_capture(streams[stream], CaptureTarget::Private(pool))
                            .unwrap(),
                    );
                    dev.begin_capture(streams[stream]);
                }
            }
            Op::EndCapture => {
                if let Some(c) = capture.take() {
                    // The driver's capture ends first, then the allocator's.
                    dev.end_capture(c.stream());
                }
            }
            Op::DropGraphPool => graph_pool = None,
            Op::ProcessPending => {
                alloc.process_pending().unwrap();
            }
        }
        let st = alloc.stats();
        prop_assert!(st.reserved_bytes <= MEMORY_LIMIT, "memory limit holds");
        prop_assert_eq!(
            st.reserved_bytes,
            dev.stats().used,
            "reserved matches the device"
        );
        let expected_active: u64 = live.iter().map(|(a, _)| a.block_size()).sum();
        let pending_extra = st.active_bytes.checked_sub(expected_active);
        prop_assert_eq!(
            pending_extra,
            Some(0),
            "active bytes are exactly the live blocks"
        );
        let per_tag: u64 = st.per_tag.iter().map(|(_, u)| u.current).sum();
        prop_assert_eq!(per_tag, st.active_bytes);
        // Counted from the blocks themselves, not from the counters `cached` is derived from.
        let snap = alloc.snapshot();
        let blocks = || snap.segments.iter().flat_map(|s| &s.blocks);
        let held: u64 = blocks()
            .filter(|b| b.state != BlockState::Active)
            .map(|b| b.size)
            .sum();
        let in_use: u64 = blocks()
            .filter(|b| b.state == BlockState::Active)
            .map(|b| b.size)
            .sum();
        let segments: u64 = snap.segments.iter().map(|s| s.size).sum();
        prop_assert_eq!(st.cached_bytes, held, "cached = free and pending blocks");
        prop_assert_eq!(in_use, expected_active, "active blocks = live allocations");
        prop_assert_eq!(segments, dev.stats().used, "segments = device memory");
        prop_assert!(
            dev.capture_violations().is_empty(),
            "capture-illegal calls: {:?}",
            dev.capture_violations()
        );
    }
    if let Some(c) = capture.take() {
        dev.end_capture(c.stream());
    }
    drop(graph_pool);
    drop(live);
    dev.complete_all();
    prop_assert_eq!(alloc.process_pending().unwrap(), 0);
    let st = alloc.stats();
    prop_assert_eq!(st.active_bytes, 0);
    prop_assert_eq!(st.reserved_bytes, st.cached_bytes);
    alloc.clear_cache().unwrap();
    prop_assert_eq!(alloc.stats().reserved_bytes, 0);
    prop_assert_eq!(dev.stats().live, 0);
    Ok(())
}

/// 96 random cases after the seeds committed in `properties.proptest-regressions`, which run
/// first; a new failure is appended there.
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 96,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

#[test]
fn committed_regression_seeds_are_replayed() {
    let persistence = config()
        .failure_persistence
        .expect("failure persistence is on, so committed seeds are replayed");
    let seeds = persistence.load_persisted_failures2(Some(file!()));
    assert!(
        seeds.len() >= 2,
        "the committed seeds are found next to this file: {seeds:?}"
    );
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn allocator_invariants(ops in proptest::collection::vec(op(), 1..160)) {
        run(ops)?;
    }
}
