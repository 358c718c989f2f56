//! A group of ranks that are threads of one process, joined over host memory.
//!
//! Each collective is a round. A rank leaves its contribution in its slot and waits; the last
//! to arrive combines the slots in rank order (so the sum has the same bits on every rank and
//! in every run), publishes the result and starts the next round. A rank reads the result of
//! its round before it can contribute to the next, and a round completes only once every rank
//! has contributed, so a published result stays until every rank has read it.

use crate::{Collective, CollectiveError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a rank waits for the others before it stops the group: a rank that failed without
/// saying so, or hangs, ends the run with an error rather than a hang.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// What a round combines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Sum(usize),
    Gather(usize),
}

impl Op {
    fn describe(self) -> String {
        match self {
            Op::Sum(n) => format!("all_reduce_sum of {n} values"),
            Op::Gather(n) => format!("all_gather of {n} values a rank"),
        }
    }
}

#[derive(Default)]
struct Round {
    /// The round being collected.
    round: u64,
    /// Each rank's contribution to it.
    slots: Vec<Option<Vec<f32>>>,
    /// The first contributor's op, which every rank must match.
    op: Option<(usize, Op)>,
    /// The result of the last completed round.
    done: Option<(u64, Arc<Vec<f32>>)>,
    /// Why the group stopped, and which rank stopped it.
    stopped: Option<(usize, String)>,
}

struct Shared {
    state: Mutex<Round>,
    arrived: Condvar,
    ranks: usize,
    timeout: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Round> {
        // A rank that panicked holding the lock leaves a poisoned mutex; the state stays
        // consistent (every change is made whole under the lock), so the others go on and
        // time out or see its abort.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One rank of an in-process group ([`group`]).
pub struct InProcess {
    rank: usize,
    shared: Arc<Shared>,
    /// The next round this rank takes part in.
    round: u64,
}

/// A group of `ranks` ranks, each to be moved to its own thread, that stop after waiting
/// `timeout` for one another.
pub fn group_with_timeout(ranks: usize, timeout: Duration) -> Vec<InProcess> {
    let shared = Arc::new(Shared {
        state: Mutex::new(Round {
            slots: vec![None; ranks],
            ..Round::default()
        }),
        arrived: Condvar::new(),
        ranks,
        timeout,
    });
    (0..ranks)
        .map(|rank| InProcess {
            rank,
            shared: Arc::clone(&shared),
            round: 0,
        })
        .collect()
}

/// A group of `ranks` ranks with the [`DEFAULT_TIMEOUT`].
pub fn group(ranks: usize) -> Vec<InProcess> {
    group_with_timeout(ranks, DEFAULT_TIMEOUT)
}

impl InProcess {
    /// Takes part in this rank's next round with `contribution`; returns the round's result.
    fn round(&mut self, op: Op, contribution: Vec<f32>) -> Result<Arc<Vec<f32>>, CollectiveError> {
        let shared = Arc::clone(&self.shared);
        let mut s = shared.lock();
        let stopped = |s: &Round| {
            s.stopped
                .as_ref()
                .map(|(rank, reason)| CollectiveError::Aborted {
                    rank: *rank,
                    reason: reason.clone(),
                })
        };
        if let Some(e) = stopped(&s) {
            return Err(e);
        }
        let mine = self.round;
        debug_assert_eq!(
            s.round, mine,
            "a round completes only with every rank's part"
        );
        match s.op {
            Some((first, want)) if want != op => {
                let e = CollectiveError::Mismatch {
                    rank: self.rank,
                    first,
                    round: mine,
                    got: op.describe(),
                    want: want.describe(),
                };
                s.stopped = Some((self.rank, e.to_string()));
                shared.arrived.notify_all();
                return Err(e);
            }
            Some(_) => {}
            None => s.op = Some((self.rank, op)),
        }
        s.slots[self.rank] = Some(contribution);
        if s.slots.iter().all(Option::is_some) {
            let parts: Vec<Vec<f32>> = s.slots.iter_mut().filter_map(Option::take).collect();
            s.done = Some((mine, Arc::new(combine(op, parts))));
            s.op = None;
            s.round += 1;
            shared.arrived.notify_all();
        } else {
            let start = Instant::now();
            while s.round == mine {
                if let Some(e) = stopped(&s) {
                    return Err(e);
                }
                let left = shared.timeout.saturating_sub(start.elapsed());
                if left.is_zero() {
                    let missing = (0..shared.ranks)
                        .filter(|&r| s.slots[r].is_none())
                        .collect();
                    let e = CollectiveError::Timeout {
                        rank: self.rank,
                        round: mine,
                        missing,
                        waited_ms: shared.timeout.as_millis() as u64,
                    };
                    s.stopped = Some((self.rank, e.to_string()));
                    shared.arrived.notify_all();
                    return Err(e);
                }
                s = shared
                    .arrived
                    .wait_timeout(s, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        self.round += 1;
        match &s.done {
            Some((round, result)) if *round == mine => Ok(Arc::clone(result)),
            // Unreachable while every rank follows the rounds: the next round cannot complete
            // without this rank's part.
            _ => Err(CollectiveError::Library(format!(
                "rank {} lost the result of collective {mine}",
                self.rank
            ))),
        }
    }
}

/// The result of a round from the ranks' parts, in rank order.
fn combine(op: Op, parts: Vec<Vec<f32>>) -> Vec<f32> {
    match op {
        Op::Sum(n) => {
            let mut sum = vec![0.0f32; n];
            for part in &parts {
                for (s, &v) in sum.iter_mut().zip(part) {
                    *s += v;
                }
            }
            sum
        }
        Op::Gather(_) => parts.concat(),
    }
}

impl Collective for InProcess {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.shared.ranks
    }

    fn all_reduce_sum(&mut self, values: &mut [f32]) -> Result<(), CollectiveError> {
        let sum = self.round(Op::Sum(values.len()), values.to_vec())?;
        values.copy_from_slice(&sum);
        Ok(())
    }

    fn all_gather(&mut self, mine: &[f32], out: &mut [f32]) -> Result<(), CollectiveError> {
        let want = mine.len() * self.shared.ranks;
        if out.len() != want {
            let e = CollectiveError::Length(format!(
                "all_gather of {} values a rank over {} ranks needs {want} values out, got {}",
                mine.len(),
                self.shared.ranks,
                out.len()
            ));
            self.abort(&e.to_string());
            return Err(e);
        }
        let all = self.round(Op::Gather(mine.len()), mine.to_vec())?;
        out.copy_from_slice(&all);
        Ok(())
    }

    fn abort(&mut self, reason: &str) {
        let mut s = self.shared.lock();
        if s.stopped.is_none() {
            s.stopped = Some((self.rank, reason.to_string()));
        }
        self.shared.arrived.notify_all();
    }
}

impl Drop for InProcess {
    /// A rank that goes away stops the group, so no other rank waits for it until the timeout;
    /// ranks that already have their last result are not affected.
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        if s.stopped.is_none() {
            let reason = format!("rank {} left the group", self.rank);
            s.stopped = Some((self.rank, reason));
        }
        self.shared.arrived.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    /// Runs `f` on every rank of a group of `ranks`, each on its own thread; returns their
    /// results in rank order.
    fn on_ranks<T: Send + 'static>(
        ranks: usize,
        timeout: Duration,
        f: impl Fn(InProcess) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = Arc::new(f);
        let threads: Vec<_> = group_with_timeout(ranks, timeout)
            .into_iter()
            .map(|c| {
                let f = Arc::clone(&f);
                thread::spawn(move || f(c))
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn every_rank_gets_the_sum_in_rank_order_round_after_round() {
        for ranks in [1, 2, 4] {
            let got = on_ranks(ranks, DEFAULT_TIMEOUT, move |mut c| {
                let r = c.rank() as f32;
                let mut sums = Vec::new();
                for round in 0..50 {
                    // A sum that depends on the order in f32: 1e8 then 5s (each rounds up by 3)
                    // differs from the 5s first (15 exactly, then one rounding).
                    let mut v = vec![r + round as f32, if r == 0.0 { 1e8 } else { 5.0 }, 0.5];
                    c.all_reduce_sum(&mut v).unwrap();
                    sums.push(v);
                }
                sums
            });
            let n = ranks as f32;
            for round in 0..50 {
                let first: f32 = (0..ranks).map(|r| r as f32 + round as f32).sum();
                let want = [first, (1..ranks).fold(1e8f32, |s, _| s + 5.0), 0.5 * n];
                for rank in &got {
                    assert_eq!(rank[round], want, "{ranks} ranks, round {round}");
                }
            }
        }
    }

    #[test]
    fn a_gather_puts_every_rank_in_place() {
        let got = on_ranks(3, DEFAULT_TIMEOUT, |mut c| {
            let r = c.rank() as f32;
            let mut out = vec![0.0; 6];
            c.all_gather(&[r, r + 0.5], &mut out).unwrap();
            out
        });
        for out in got {
            assert_eq!(out, [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
        }
    }

    #[test]
    fn a_rank_that_aborts_stops_the_others_with_its_reason() {
        let got = on_ranks(3, Duration::from_secs(60), |mut c| {
            if c.rank() == 1 {
                c.abort("out of memory on rank 1");
                return Err(CollectiveError::Library("aborted".into()));
            }
            let mut v = vec![1.0];
            c.all_reduce_sum(&mut v)
        });
        for (rank, r) in got.iter().enumerate().filter(|(r, _)| *r != 1) {
            let e = r.as_ref().unwrap_err().to_string();
            assert!(e.contains("out of memory on rank 1"), "rank {rank}: {e}");
        }
    }

    #[test]
    fn a_rank_that_leaves_or_never_comes_ends_the_wait() {
        // Rank 2 returns without a collective: its handle drops and the group stops at once.
        let start = Instant::now();
        let got = on_ranks(3, Duration::from_secs(60), |mut c| {
            if c.rank() == 2 {
                return Ok(());
            }
            c.all_reduce_sum(&mut [1.0])
        });
        assert!(start.elapsed() < Duration::from_secs(30));
        let e = got[0].as_ref().unwrap_err().to_string();
        assert!(e.contains("rank 2 left the group"), "{e}");
        // A rank that hangs (here: sleeps past the timeout) times the others out.
        let got = on_ranks(2, Duration::from_millis(200), |mut c| {
            if c.rank() == 1 {
                thread::sleep(Duration::from_millis(600));
            }
            c.all_reduce_sum(&mut [1.0])
        });
        let e = got[0].as_ref().unwrap_err().to_string();
        assert!(e.contains("ranks [1]") && e.contains("stopped"), "{e}");
        assert!(got[1].is_err(), "the late rank finds the group stopped");
    }

    #[test]
    fn ranks_that_call_different_collectives_are_told_which() {
        let got = on_ranks(2, Duration::from_secs(60), |mut c| match c.rank() {
            0 => c.all_reduce_sum(&mut [1.0, 2.0]),
            _ => c.all_reduce_sum(&mut [1.0, 2.0, 3.0]),
        });
        let errors: Vec<String> = got
            .iter()
            .map(|r| r.as_ref().unwrap_err().to_string())
            .collect();
        assert!(
            errors
                .iter()
                .all(|e| e.contains("of 3 values") && e.contains("of 2 values")),
            "{errors:?}"
        );
    }
}
