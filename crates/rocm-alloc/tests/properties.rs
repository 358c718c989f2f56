//! Property tests on `SimDevice`: random sequences of allocations, frees, cross-stream uses,
//! stream progress, trims, limit changes and graph-capture pools, checked against a model after
//! every step.

use std::sync::Arc;

use proptest::prelude::*;
use rocm_alloc::backends::sim::SimDevice;
use rocm_alloc::size_class::round_request;
use rocm_alloc::{
    AllocError, Allocation, Allocator, AllocatorConfig, CaptureTarget, LimitSpec, StreamId, Tag,
};

const STREAMS: [StreamId; 3] = [StreamId(0), StreamId(1), StreamId(2)];
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

/// A freed range that must not be handed out again until `stream` has completed the work
/// submitted before the free (`target`).
struct Quarantine {
    addr: u64,
    size: u64,
    stream: StreamId,
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
        let w = &mut work[q.stream.0 as usize];
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
    let mut live: Vec<(Allocation, Vec<StreamId>)> = Vec::new();
    let mut quarantine: Vec<Quarantine> = Vec::new();
    let mut work = [Work::default(); 3];
    let mut graph_pool: Option<rocm_alloc::GraphPool> = None;
    let mut capture: Option<rocm_alloc::CaptureGuard> = None;

    for op in ops {
        match op {
            Op::Alloc { size, stream, tag } => {
                let retries = alloc.stats().oom_retries;
                match alloc.alloc(size, STREAMS[stream], Tag::ALL[tag]) {
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
                        waited_all(&mut quarantine, &mut work);
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
                        let w = work[s.0 as usize];
                        if w.submitted > w.completed && s != a.stream() {
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
                    live[i].0.record_stream(STREAMS[stream]);
                    live[i].1.push(STREAMS[stream]);
                }
            }
            Op::SubmitWork { stream } => {
                dev.submit_work(STREAMS[stream]);
                work[stream].submitted += 1;
            }
            Op::CompleteStream { stream } => {
                dev.complete_stream(STREAMS[stream]);
                work[stream].completed = work[stream].submitted;
                quarantine.retain(|q| q.stream != STREAMS[stream]);
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
                prop_assert!(alloc.stats().releasable_bytes <= bytes.max(1));
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
                            .begin_capture(STREAMS[stream], CaptureTarget::Private(pool))
                            .unwrap(),
                    );
                }
            }
            Op::EndCapture => capture = None,
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
        prop_assert_eq!(st.cached_bytes, st.reserved_bytes - st.active_bytes);
    }
    drop(capture);
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn allocator_invariants(ops in proptest::collection::vec(op(), 1..160)) {
        run(ops)?;
    }
}
