//! The scheduler and the KV block pool under random arrivals, lengths, budgets and
//! cancellations, with a stand-in model whose next token is a function of the request and the
//! position (so recomputation after a preemption must give the same tokens). Every step: the
//! pool stays within its budget and each block is held exactly by the tables that name it;
//! the batch fits the step's token limit, decode rows come before prompt chunks, and each
//! sequence's rows are its next positions. At the end every admitted request has finished
//! within a step bound the test computes (no livelock from preemption, no starvation), with
//! the tokens the stand-in model gives, no block is held, and a cancelled request's blocks
//! were free after the step that followed its cancellation.
//!
//! With window rings on, a stand-in ring per run records which tokens' keys each of its slots
//! holds, and every row must find its request's own keys at each position its window reads
//! that the step does not write: a sequence that went on from a finished one's prefix must
//! have been given that one's ring, and the ring must still hold the window.

use decode::batch::RowKind;
use decode::kv::BlockPool;
use decode::sampler::SamplerConfig;
use decode::scheduler::{Event, Finish, Request, RequestId, ScheduleError, Scheduler};
use decode::scheduler::{RingConfig, SchedulerConfig};
use proptest::prelude::*;
use std::collections::HashMap;

const BLOCK: usize = 4;
const BYTES_PER_BLOCK: u64 = 1000;
const MAX_POSITIONS: usize = 48;
/// The stand-in window layers' window.
const WINDOW: usize = 6;

/// The stand-in model's token after `pos` positions of request `id`.
fn next_token(id: RequestId, pos: usize) -> u32 {
    ((id.0 as u32).wrapping_mul(2_654_435_761) ^ (pos as u32).wrapping_mul(40_503)) % 1000
}

#[derive(Clone, Debug)]
struct Arrival {
    at_step: usize,
    prompt: usize,
    prompt_len: usize,
    max_new: usize,
    /// Cancel it this many steps after it arrives.
    cancel_after: Option<usize>,
    stop: Option<u32>,
}

fn arrival() -> impl Strategy<Value = Arrival> {
    (
        0..12usize,
        0..3usize,
        1..24usize,
        1..12usize,
        prop::option::weighted(0.15, 0..6usize),
        prop::option::weighted(0.2, 0..1000u32),
    )
        .prop_map(
            |(at_step, prompt, prompt_len, max_new, cancel_after, stop)| Arrival {
                at_step,
                prompt,
                prompt_len,
                max_new,
                cancel_after,
                stop,
            },
        )
}

fn prompt_tokens(which: usize, len: usize) -> Vec<u32> {
    // Prompts 0 and 1 share their first 8 tokens (two blocks); prompt 2 shares nothing.
    (0..len as u32)
        .map(|i| match which {
            0 => 5000 + i,
            1 if i < 8 => 5000 + i,
            1 => 6000 + i,
            _ => 7000 + i,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn every_admitted_request_finishes_within_budget_and_bound(
        arrivals in prop::collection::vec(arrival(), 1..16),
        budget_blocks in 3u64..24,
        max_running in 1usize..5,
        extra_tokens in 0usize..12,
        prefix_cache in any::<bool>(),
        rings in any::<bool>(),
        spare_runs in 0usize..3,
    ) {
        let pool = BlockPool::new(BLOCK, BYTES_PER_BLOCK, budget_blocks * BYTES_PER_BLOCK, 2).unwrap();
        let config = SchedulerConfig {
            max_running,
            step_tokens: max_running + extra_tokens,
            max_positions: MAX_POSITIONS,
            prefix_cache,
            rings: rings.then_some(RingConfig {
                runs: max_running + spare_runs,
                slack: max_running + extra_tokens - 1,
            }),
        };
        // Each run's ring: slot `pos % ring_slots` holds the keys of the tokens up to `pos`.
        let ring_slots = WINDOW + config.step_tokens - 1;
        let mut ring_holds: Vec<Vec<Option<Vec<u32>>>> =
            vec![vec![None; ring_slots]; max_running + spare_runs];
        let mut prompts: HashMap<RequestId, Vec<u32>> = HashMap::new();
        let mut sched = Scheduler::new(config, pool).unwrap();
        let mut ids: Vec<Option<RequestId>> = vec![None; arrivals.len()];
        let mut outputs: HashMap<RequestId, Vec<u32>> = HashMap::new();
        let mut finished: HashMap<RequestId, Finish> = HashMap::new();
        let mut cancelled_at: HashMap<RequestId, usize> = HashMap::new();
        let mut work = 0usize;
        let last_arrival = arrivals.iter().map(|a| a.at_step).max().unwrap_or(0);
        let mut step = 0usize;
        loop {
            for (k, a) in arrivals.iter().enumerate() {
                if a.at_step == step {
                    let prompt = prompt_tokens(a.prompt, a.prompt_len);
                    let request = Request {
                        prompt: prompt.clone(),
                        sampler: SamplerConfig::default(),
                        max_new: a.max_new,
                        stop: a.stop.into_iter().collect(),
                    };
                    let positions = (a.prompt_len + a.max_new - 1).min(MAX_POSITIONS);
                    match sched.submit(request) {
                        Ok(id) => {
                            prompts.insert(id, prompt);
                            prop_assert!(positions.div_ceil(BLOCK) as u64 <= budget_blocks);
                            ids[k] = Some(id);
                            work += a.prompt_len + a.max_new;
                        }
                        Err(e @ ScheduleError::NeverFits { .. }) => {
                            prop_assert!(positions.div_ceil(BLOCK) as u64 > budget_blocks);
                            prop_assert!(e.to_string().contains("bytes"), "{}", e);
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                if let (Some(id), Some(after)) = (ids[k], a.cancel_after) {
                    if a.at_step + after == step && !finished.contains_key(&id) {
                        sched.cancel(id);
                        cancelled_at.insert(id, step);
                    }
                }
            }
            let plan = sched.plan_step();
            // The batch: within the limit, decode rows first, each slot's rows consecutive.
            prop_assert!(plan.batch.len() <= config.step_tokens);
            let mut seen_prefill = false;
            let mut slot_next: HashMap<usize, usize> = HashMap::new();
            let mut slot_request: HashMap<usize, RequestId> = HashMap::new();
            for (r, row) in plan.batch.rows().enumerate() {
                match row.kind {
                    RowKind::Prefill => seen_prefill = true,
                    RowKind::Decode => prop_assert!(!seen_prefill, "a decode row after a prompt chunk"),
                }
                if let Some(&next) = slot_next.get(&row.seq) {
                    prop_assert_eq!(row.pos, next);
                }
                slot_next.insert(row.seq, row.pos + 1);
                let owner = *slot_request.entry(row.seq).or_insert(plan.requests[r]);
                prop_assert_eq!(owner, plan.requests[r], "two requests in one slot");
                prop_assert!(row.pos < MAX_POSITIONS);
                let table = sched.blocks(row.seq).unwrap_or(&[]);
                prop_assert!(
                    matches!(table.get(row.pos / BLOCK), Some(Some(_))),
                    "row at position {} of slot {} has no block", row.pos, row.seq
                );
            }
            // The window rings: each running slot holds its own run, and every position a row's
            // window reads that the step does not write holds the request's own keys.
            if rings {
                let mut runs: Vec<usize> = (0..max_running).filter_map(|s| sched.ring_run(s)).collect();
                prop_assert_eq!(runs.len(), sched.running(), "a running sequence without a ring");
                runs.sort_unstable();
                runs.dedup();
                prop_assert_eq!(runs.len(), sched.running(), "two sequences on one ring");
                let history = |id: RequestId| {
                    let mut t = prompts[&id].clone();
                    t.extend(outputs.get(&id).into_iter().flatten());
                    t
                };
                let mut writes = Vec::new();
                for (r, row) in plan.batch.rows().enumerate() {
                    let run = sched.ring_run(row.seq).expect("a running slot's ring");
                    let tokens = history(plan.requests[r]);
                    let first_in_step = plan.batch.rows().find(|x| x.seq == row.seq).map(|x| x.pos);
                    for q in row.pos.saturating_sub(WINDOW - 1)..row.pos {
                        if first_in_step.is_some_and(|f| q >= f) {
                            continue;
                        }
                        prop_assert_eq!(
                            ring_holds[run][q % ring_slots].as_deref(),
                            Some(&tokens[..=q]),
                            "slot {} at position {} reads position {} from ring {}",
                            row.seq, row.pos, q, run
                        );
                    }
                    writes.push((run, row.pos, tokens[..=row.pos].to_vec()));
                }
                for (run, pos, tokens) in writes {
                    ring_holds[run][pos % ring_slots] = Some(tokens);
                }
            }
            // The pool: within budget, each block held by exactly the tables naming it.
            let stats = sched.pool().stats();
            prop_assert!(stats.committed <= stats.budget_blocks);
            let mut held = vec![0u32; stats.committed];
            for slot in 0..max_running {
                for id in sched.blocks(slot).unwrap_or(&[]).iter().flatten() {
                    held[id.0 as usize] += 1;
                }
            }
            prop_assert_eq!(sched.pool().reference_counts(), held);
            for u in sched.usage() {
                let table = sched.blocks(u.slot).unwrap_or(&[]);
                prop_assert_eq!(u.blocks, table.iter().flatten().count());
                prop_assert_eq!(u.bytes, u.blocks as u64 * BYTES_PER_BLOCK);
                prop_assert!(u.blocks >= u.positions.div_ceil(BLOCK));
            }
            // A cancelled request holds nothing once a step has been planned after it.
            for (&id, &at) in &cancelled_at {
                if at <= step {
                    prop_assert!(!plan.requests.contains(&id), "a cancelled request still runs");
                }
            }
            // The stand-in model samples for the rows that asked.
            let sampled: Vec<u32> = plan
                .batch
                .output_rows()
                .map(|r| next_token(plan.requests[r], plan.batch.row(r).pos + 1))
                .collect();
            for event in sched.finish_step(&plan, &sampled) {
                match event {
                    Event::Token { id, token } => outputs.entry(id).or_default().push(token),
                    Event::Finished { id, reason } => {
                        prop_assert!(finished.insert(id, reason).is_none(), "finished twice");
                    }
                }
            }
            step += 1;
            if step > last_arrival && sched.pending() == 0 {
                break;
            }
            prop_assert!(step <= last_arrival + work + 2, "not finished within {} steps", last_arrival + work + 2);
        }
        // Every admitted request finished with the stand-in model's tokens.
        for (k, a) in arrivals.iter().enumerate() {
            let Some(id) = ids[k] else { continue };
            let reason = finished.get(&id).copied();
            prop_assert!(reason.is_some(), "request {} never finished", k);
            let got = outputs.get(&id).cloned().unwrap_or_default();
            let want: Vec<u32> = (0..got.len()).map(|g| next_token(id, a.prompt_len + g)).collect();
            prop_assert_eq!(&got, &want, "request {} got other tokens", k);
            match reason {
                Some(Finish::Cancelled) => prop_assert!(cancelled_at.contains_key(&id)),
                Some(Finish::Stop) => prop_assert_eq!(got.last().copied(), a.stop),
                Some(Finish::TokenLimit) => prop_assert_eq!(got.len(), a.max_new),
                Some(Finish::ContextFull) => prop_assert_eq!(a.prompt_len + got.len(), MAX_POSITIONS + 1),
                None => {}
            }
        }
        prop_assert_eq!(sched.pool().stats().in_use, 0, "blocks still held at the end");
    }
}

/// A scheduler of two running sequences, 64 tokens a step and the prefix cache on, over `pool`.
fn two_sequences(pool: BlockPool) -> Scheduler {
    let config = SchedulerConfig {
        max_running: 2,
        step_tokens: 64,
        max_positions: 4096,
        prefix_cache: true,
        rings: None,
    };
    Scheduler::new(config, pool).unwrap()
}

#[test]
fn a_request_that_can_never_fit_is_refused_with_its_bytes() {
    let pool = BlockPool::new(16, 1 << 20, 4 << 20, 1).unwrap();
    let mut sched = two_sequences(pool);
    let request = Request {
        prompt: vec![1; 60],
        sampler: SamplerConfig::default(),
        max_new: 10,
        stop: Vec::new(),
    };
    let e = sched.submit(request).unwrap_err().to_string();
    assert!(
        e.contains("69 positions") && e.contains("5242880 bytes") && e.contains("4194304 bytes"),
        "{e}"
    );
}

/// A request ended by a failure of its step leaves none of what it computed in the prefix
/// cache (those keys and values may be what failed), where a cancelled one leaves its full
/// blocks for the next request with the same prompt; and its row's token is not kept.
#[test]
fn a_failed_request_leaves_nothing_in_the_prefix_cache() {
    for fail in [false, true] {
        let pool = BlockPool::new(16, 1 << 10, 64 << 10, 1).unwrap();
        let mut sched = two_sequences(pool);
        let request = Request {
            prompt: (0..40).collect(),
            sampler: SamplerConfig::default(),
            max_new: 10,
            stop: Vec::new(),
        };
        let id = sched.submit(request.clone()).unwrap();
        let plan = sched.plan_step();
        assert_eq!(plan.batch.len(), 40);
        match fail {
            true => sched.fail(id),
            false => sched.cancel(id),
        }
        let events = sched.finish_step(&plan, &[7]);
        assert!(
            !events.contains(&Event::Token { id, token: 7 }),
            "fail {fail}: {events:?}"
        );
        sched.submit(request).unwrap();
        let plan = sched.plan_step();
        let found = plan.started[0].1.len();
        assert_eq!(found, if fail { 0 } else { 32 }, "fail {fail}");
    }
}

/// A request admitted while another with the same prompt still runs starts from that one's
/// full blocks, shared by reference count (issue 21's prefix sharing): its prefill begins
/// after them, the pool counts them shared, and when both finish every block is released.
#[test]
fn a_running_sequence_s_full_blocks_are_shared_with_a_request_admitted_after_them() {
    let pool = BlockPool::new(16, 1 << 10, 64 << 10, 1).unwrap();
    let mut sched = two_sequences(pool);
    let shared: Vec<u32> = (0..40).collect();
    let request = |tail: u32| Request {
        prompt: shared.iter().copied().chain([100 + tail]).collect(),
        sampler: SamplerConfig::default(),
        max_new: 3,
        stop: Vec::new(),
    };
    let first = sched.submit(request(0)).unwrap();
    let plan = sched.plan_step();
    assert_eq!(plan.batch.len(), 41, "the first prompt in one step");
    sched.finish_step(&plan, &[7]);
    let second = sched.submit(request(1)).unwrap();
    let plan = sched.plan_step();
    assert_eq!(plan.admitted, vec![second]);
    // The second starts after the first's two full blocks (32 positions).
    assert_eq!(plan.started[0].1.len(), 32, "positions found");
    let rows: Vec<usize> = (plan.batch.rows())
        .zip(&plan.requests)
        .filter(|(_, id)| **id == second)
        .map(|(r, _)| r.pos)
        .collect();
    assert_eq!(rows, (32..41).collect::<Vec<_>>(), "its prefill rows");
    assert_eq!(sched.pool().stats().shared, 2, "blocks held by both");
    let mut finished = Vec::new();
    let mut plan = plan;
    for _ in 0..8 {
        let asked = plan.batch.output_rows().count();
        for e in sched.finish_step(&plan, &vec![9; asked]) {
            if let Event::Finished { id, .. } = e {
                finished.push(id);
            }
        }
        plan = sched.plan_step();
        if plan.batch.is_empty() {
            break;
        }
    }
    finished.sort();
    assert_eq!(finished, vec![first, second]);
    assert!(
        sched.pool().reference_counts().iter().all(|&r| r == 0),
        "no block held after both finished"
    );
}
