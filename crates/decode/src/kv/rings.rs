//! [`RingRuns`]: the sliding-window layers' rings as the prefix cache sees them.
//!
//! A sliding-window layer keeps a ring of `window + max_batch - 1` slots per sequence, a run
//! of blocks outside the pool ([`super::tables`]). A prefix found in the pool is then only
//! half of what a new sequence needs: its window layers must also read the keys and values
//! of the `window` positions before the prefix's end, and only the ring of the sequence that
//! wrote that prefix holds them. So a finished sequence's run stays as it was, with the tokens
//! its positions hold, and a new sequence whose prompt begins with those tokens takes the run
//! over: its ring table names the run ([`super::BlockTables::set_ring_run`]), nothing is
//! copied.
//!
//! A run can be gone on from at a prefix of `h` positions only when the ring still holds
//! `h - window .. h`. A slot holds the last position written to it, so that needs `high - h`
//! at most the ring's slots past the window (`slack`, at least `max_batch - 1`), where `high`
//! is one past the highest position any sequence on the run wrote since it was last taken
//! fresh: a sequence that went on from `h0` and stopped short of its predecessor's end leaves
//! the predecessor's later writes in the ring. Below `h0` only the window before `h0` was
//! known good, so `h` must also be at least `h0`. A conversation's next turn starts with the
//! whole of the last one, so it goes on from the end of the block before the last one's end.
//!
//! There are as many runs as the context has sequences, so a sequence admitted to a free
//! sequence slot always gets one: a free run, or else the least recently left cached one.

/// One run's state.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Run {
    Free,
    /// A running sequence's ring.
    Held(Written),
    /// A finished sequence's ring, holding the keys and values of `tokens` (from position
    /// 0) as far as `written` allows; left at tick `at`.
    Cached {
        tokens: Vec<u32>,
        written: Written,
        at: u64,
    },
}

/// What a run's slots may hold (the module's notes say why).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Written {
    /// The prefix its holder went on from (0 when taken fresh): below it, only the window
    /// before it was known good.
    floor: usize,
    /// One past the highest position written to it since it was last taken fresh.
    high: usize,
}

/// The ring runs of a context's sliding-window layers: who holds each, and the cached ones.
#[derive(Clone, Debug)]
pub struct RingRuns {
    runs: Vec<Run>,
    slack: usize,
    tick: u64,
}

/// A cached run a prompt can go on from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingHit {
    pub run: usize,
    /// Positions of the prompt the run (and the pool) already hold: whole blocks.
    pub len: usize,
}

impl RingRuns {
    /// `runs` runs (the context's sequences), each of whose rings holds `slack` slots past
    /// its window.
    pub fn new(runs: usize, slack: usize) -> RingRuns {
        RingRuns {
            runs: vec![Run::Free; runs],
            slack,
            tick: 0,
        }
    }

    /// The longest prefix of `tokens`, at most `max_len` positions and in whole blocks of
    /// `block`, that a cached run holds the window before: the run and the prefix's length.
    pub fn find(&self, tokens: &[u32], max_len: usize, block: usize) -> Option<RingHit> {
        let max_len = max_len.min(tokens.len());
        let mut best: Option<RingHit> = None;
        for (run, state) in self.runs.iter().enumerate() {
            let Run::Cached {
                tokens: held,
                written,
                ..
            } = state
            else {
                continue;
            };
            let same = (held.iter().zip(&tokens[..max_len]))
                .take_while(|(a, b)| a == b)
                .count();
            let len = same / block * block;
            let holds_window = len >= written.floor && written.high <= len + self.slack;
            if len > 0 && holds_window && best.is_none_or(|b| len > b.len) {
                best = Some(RingHit { run, len });
            }
        }
        best
    }

    /// A run for a sequence that starts now: `hit`'s run (one [`Self::find`] gave), else a
    /// free run, else the least recently left cached one. `None` only when every run is held.
    pub fn take(&mut self, hit: Option<RingHit>) -> Option<usize> {
        if let Some(h) = hit {
            if let Some(Run::Cached { written, .. }) = self.runs.get(h.run) {
                let high = written.high;
                self.runs[h.run] = Run::Held(Written { floor: h.len, high });
                return Some(h.run);
            }
        }
        let run = match self.runs.iter().position(|r| *r == Run::Free) {
            Some(run) => run,
            None => {
                (self.runs.iter().enumerate())
                    .filter_map(|(i, r)| match r {
                        Run::Cached { at, .. } => Some((*at, i)),
                        _ => None,
                    })
                    .min()?
                    .1
            }
        };
        // Taken fresh: its holder writes every position it reads before reading it.
        self.runs[run] = Run::Held(Written::default());
        Some(run)
    }

    /// Gives back a held run: cached as holding `tokens` (every position of them written),
    /// or free with `None` (what its ring holds is not worth keeping, or not to be trusted).
    pub fn release(&mut self, run: usize, tokens: Option<&[u32]>) {
        let written = match self.runs.get(run) {
            Some(Run::Held(written)) => *written,
            _ => return,
        };
        self.runs[run] = match tokens {
            Some(t) if !t.is_empty() => {
                self.tick += 1;
                Run::Cached {
                    tokens: t.to_vec(),
                    written: Written {
                        high: written.high.max(t.len()),
                        ..written
                    },
                    at: self.tick,
                }
            }
            _ => Run::Free,
        };
    }

    /// Forgets every cached run (their rings' contents are no longer found).
    pub fn drop_cache(&mut self) {
        for r in &mut self.runs {
            if matches!(r, Run::Cached { .. }) {
                *r = Run::Free;
            }
        }
    }

    /// Runs held by running sequences, and cached runs.
    pub fn counts(&self) -> (usize, usize) {
        let held = (self.runs.iter())
            .filter(|r| matches!(r, Run::Held(_)))
            .count();
        let cached = (self.runs.iter())
            .filter(|r| matches!(r, Run::Cached { .. }))
            .count();
        (held, cached)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_goes_on_from_a_finished_run_within_its_slack_and_nowhere_else() {
        // Blocks of 4, rings with 5 slots past the window.
        let mut r = RingRuns::new(2, 5);
        let first = r.take(None).unwrap();
        r.release(first, Some(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]));
        // The next turn repeats all ten tokens: the prefix ends at 8, 2 before the run's end.
        let next = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
        assert_eq!(r.find(&next, 11, 4), Some(RingHit { run: first, len: 8 }));
        // A prompt that leaves the run's tokens at 5 could go on from 4 positions, but the
        // ring no longer holds the window before position 4 (10 - 4 > 5).
        assert_eq!(r.find(&[1, 2, 3, 4, 5, 0, 0, 0, 0], 8, 4), None);
        // With more slack it can.
        let mut wide = RingRuns::new(1, 6);
        wide.take(None);
        wide.release(0, Some(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]));
        assert_eq!(
            wide.find(&[1, 2, 3, 4, 5, 0], 5, 4),
            Some(RingHit { run: 0, len: 4 })
        );
        // Less than a block in common is no hit, and neither is a held run.
        assert_eq!(r.find(&[1, 2, 3, 9], 3, 4), None);
        let hit = r.find(&next, 11, 4);
        assert_eq!(r.take(hit), Some(first));
        assert_eq!(r.find(&next, 11, 4), None, "a held run is not found");
    }

    #[test]
    fn a_run_gone_on_from_keeps_what_its_last_holder_wrote_past_the_new_end() {
        let mut r = RingRuns::new(1, 4);
        let t: Vec<u32> = (0..24).collect();
        r.take(None);
        r.release(0, Some(&t));
        // Taken at 20 and left after one more position, the ring still holds what the first
        // holder wrote up to 24, which overwrote the slots of positions before 24 - 4 - window.
        let hit = r.find(&t[..21], 20, 4);
        assert_eq!(hit, Some(RingHit { run: 0, len: 20 }));
        r.take(hit);
        r.release(0, Some(&t[..21]));
        assert_eq!(r.find(&t[..17], 16, 4), None, "24 - 16 is past the slack");
        assert_eq!(r.find(&t[..21], 20, 4), Some(RingHit { run: 0, len: 20 }));
        // Below the prefix its holder went on from, nothing is known good.
        let mut wide = RingRuns::new(1, 100);
        wide.take(None);
        wide.release(0, Some(&t));
        let hit = wide.find(&t, 20, 4);
        wide.take(hit);
        wide.release(0, Some(&t));
        assert_eq!(wide.find(&t[..17], 16, 4), None);
        assert!(wide.find(&t, 20, 4).is_some());
        // Taken fresh, a run's past no longer counts.
        wide.take(None);
        wide.release(0, Some(&t[..9]));
        assert_eq!(wide.find(&t[..9], 8, 4), Some(RingHit { run: 0, len: 8 }));
    }

    #[test]
    fn runs_are_taken_free_first_then_least_recently_left() {
        let mut r = RingRuns::new(3, 0);
        let (a, b, c) = (
            r.take(None).unwrap(),
            r.take(None).unwrap(),
            r.take(None).unwrap(),
        );
        assert_eq!(r.take(None), None, "every run is held");
        r.release(b, Some(&[7]));
        r.release(a, Some(&[8]));
        r.release(c, None);
        assert_eq!(r.counts(), (0, 2));
        assert_eq!(r.take(None), Some(c), "a free run before a cached one");
        assert_eq!(r.take(None), Some(b), "then the one left first");
        // A hit on a run that was taken since falls back to another run.
        let stale = RingHit { run: b, len: 4 };
        assert_eq!(r.take(Some(stale)), Some(a));
        r.release(a, Some(&[1]));
        r.drop_cache();
        assert_eq!(r.counts(), (2, 0));
    }
}
