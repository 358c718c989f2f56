//! A pool of host threads that spin between jobs: the hybrid offload's host half runs a
//! share of a product (300-470 µs in the H200 runs) after every wait on the device, and a
//! pool whose threads have gone to sleep in between (rayon's do after a short while) spends a
//! good part of that waking them. Here the workers poll for the next job for [`SPIN`] after
//! the last one, then park; a job wakes the parked ones.
//!
//! A job is a function of the participant's index, run once by every participant (the
//! caller is participant 0) and returned from only when all have finished, so it may borrow
//! from the caller's stack.
//!
//! [`HOST_POOL`] picks this pool (`spin`, the default) or rayon's (`rayon`) for the host half,
//! for A/B runs.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

pub static HOST_POOL: knobs::Knob<PoolKind> = knobs::Knob {
    name: "HIPDECODE_HOST_POOL",
    default: "spin",
    doc: "the threads that run the hybrid offload's host half: `spin` (this crate's spinning \
          pool) or `rayon`",
    scope: knobs::Scope::Run,
    parse: |v| knobs::parse::choice(v, &[("spin", PoolKind::Spin), ("rayon", PoolKind::Rayon)]),
};

/// Which threads run the host half.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// [`HostPool::global`].
    Spin,
    /// rayon's global pool.
    Rayon,
}

impl PoolKind {
    /// The pool [`HOST_POOL`] asks for, read once.
    pub fn from_env() -> crate::error::Result<PoolKind> {
        static KIND: OnceLock<PoolKind> = OnceLock::new();
        if let Some(k) = KIND.get() {
            return Ok(*k);
        }
        let k = HOST_POOL.read()?;
        Ok(*KIND.get_or_init(|| k))
    }
}

/// How long an idle worker polls before it parks.
pub const SPIN: Duration = Duration::from_millis(2);

/// The job being run: a type-erased `&(dyn Fn(usize) + Sync)` valid while `pending > 0`.
type JobPtr = *const (dyn Fn(usize) + Sync);

struct Shared {
    /// Bumped by each job; workers run the job when they see it change.
    epoch: AtomicU64,
    /// The current job (set before `epoch` is bumped, read after it is seen).
    job: Mutex<Option<SendPtr>>,
    /// Workers that have not finished the current job.
    pending: AtomicUsize,
    /// Set when the pool is dropped.
    stop: AtomicBool,
    /// Parked workers' handles, to unpark; `None` while a worker spins.
    parked: Mutex<Vec<Option<Thread>>>,
}

impl Shared {
    /// Starts a new epoch (a job, or the stop) and unparks the workers that sleep.
    fn wake_all(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        for t in self
            .parked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .flatten()
        {
            t.unpark();
        }
    }
}

#[derive(Clone, Copy)]
struct SendPtr(JobPtr);
// SAFETY: the pointee is `Sync` and outlives every use (the submitter waits for `pending`).
unsafe impl Send for SendPtr {}

/// The pool. [`HostPool::global`] is the one the hybrid offload uses.
pub struct HostPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes jobs: one at a time.
    running: Mutex<()>,
}

impl HostPool {
    /// A pool of `threads` participants (the caller and `threads - 1` workers).
    pub fn new(threads: usize) -> HostPool {
        let n_workers = threads.max(1) - 1;
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: Mutex::new(None),
            pending: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            parked: Mutex::new(vec![None; n_workers]),
        });
        let workers = (0..n_workers)
            .map(|w| {
                let shared = Arc::clone(&shared);
                thread::Builder::new()
                    .name(format!("hipdecode-host-{}", w + 1))
                    .spawn(move || worker(&shared, w))
                    .expect("spawning a host pool thread")
            })
            .collect();
        HostPool {
            shared,
            workers,
            running: Mutex::new(()),
        }
    }

    /// The process's pool: one participant per core rayon would use (`RAYON_NUM_THREADS`
    /// applies).
    pub fn global() -> &'static HostPool {
        static POOL: OnceLock<HostPool> = OnceLock::new();
        POOL.get_or_init(|| HostPool::new(rayon::current_num_threads()))
    }

    /// Participants in a job.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `job(i)` for every participant `i` in `0..threads()`, the caller as 0, and
    /// returns when all have. A panic in a worker's call aborts the process (it cannot be
    /// handed back across threads here); jobs are plain arithmetic over checked slices.
    pub fn run(&self, job: &(dyn Fn(usize) + Sync)) {
        let _one = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let n_workers = self.workers.len();
        if n_workers > 0 {
            let short: *const (dyn Fn(usize) + Sync + '_) = job;
            // SAFETY: only the trait object's lifetime bound changes; this function does not
            // return before `pending` is back to 0, that is before every worker is done with
            // `job`, so no use outlives the borrow.
            let erased: JobPtr = unsafe { std::mem::transmute(short) };
            *self.shared.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(SendPtr(erased));
            self.shared.pending.store(n_workers, Ordering::Release);
            self.shared.wake_all();
        }
        // The workers borrow `job` until `pending` is 0: a panic of the caller's share must not
        // unwind past that, so it is held until they are done.
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(0)));
        while self.shared.pending.load(Ordering::Acquire) > 0 {
            std::hint::spin_loop();
        }
        if let Err(panic) = mine {
            std::panic::resume_unwind(panic);
        }
    }
}

impl Drop for HostPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A worker: waits for a new epoch (spinning for [`SPIN`], then parked), runs the job as
/// participant `index + 1`, reports done.
fn worker(shared: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let mut idle_since = Instant::now();
        let epoch = loop {
            let e = shared.epoch.load(Ordering::Acquire);
            if e != seen {
                break e;
            }
            if idle_since.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            // Park; registered first, so a job bumping the epoch after the check below
            // unparks this thread (a stale unpark only makes `park` return early).
            shared.parked.lock().unwrap_or_else(|e| e.into_inner())[index] =
                Some(thread::current());
            if shared.epoch.load(Ordering::Acquire) == seen {
                thread::park_timeout(Duration::from_millis(100));
            }
            shared.parked.lock().unwrap_or_else(|e| e.into_inner())[index] = None;
            idle_since = Instant::now();
        };
        seen = epoch;
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let job = shared
            .job
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .expect("a job is set");
        // SAFETY: the submitter keeps the job alive until `pending` reaches 0, which this
        // worker's decrement below is part of.
        let f = unsafe { &*job.0 };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(index + 1))).is_err() {
            // The submitter would wait forever, and the job's borrows die with its frame.
            eprintln!("a hipdecode host pool job panicked; aborting");
            std::process::abort();
        }
        shared.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Splits `0..n` among the participants of a job: participant claims chunks of `chunk`
/// through the shared counter until none are left (balances participants that started
/// late).
pub fn for_each_chunk(pool: &HostPool, n: usize, chunk: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    let next = AtomicUsize::new(0);
    let chunk = chunk.max(1);
    pool.run(&|_| loop {
        let start = next.fetch_add(chunk, Ordering::Relaxed);
        if start >= n {
            break;
        }
        f(start, (start + chunk).min(n));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_participant_runs_once_and_chunks_cover_the_range_once() {
        let pool = HostPool::new(4);
        assert_eq!(pool.threads(), 4);
        for round in 0..50 {
            let seen = Mutex::new(vec![0u32; 4]);
            pool.run(&|i| seen.lock().unwrap()[i] += 1);
            assert_eq!(*seen.lock().unwrap(), vec![1; 4], "round {round}");
            let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
            for_each_chunk(&pool, 1000, 7, &|a, b| {
                for h in &hits[a..b] {
                    h.fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "round {round}"
            );
            if round % 10 == 0 {
                // Long enough for the workers to park: a job still wakes them.
                thread::sleep(SPIN * 3);
            }
        }
    }

    #[test]
    fn a_panic_of_the_callers_share_waits_for_the_workers_then_unwinds() {
        let pool = HostPool::new(3);
        let done = AtomicUsize::new(0);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(&|i| {
                if i == 0 {
                    panic!("the caller's share");
                }
                // Longer than a panic takes to print, backtrace included.
                thread::sleep(Duration::from_millis(1500));
                done.fetch_add(1, Ordering::SeqCst);
            })
        }));
        assert!(caught.is_err());
        assert_eq!(
            done.load(Ordering::SeqCst),
            2,
            "both workers finished before the unwind"
        );
        // The pool still works.
        let count = AtomicUsize::new(0);
        pool.run(&|_| {
            count.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(count.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_pool_of_one_runs_on_the_caller() {
        let pool = HostPool::new(1);
        let count = AtomicUsize::new(0);
        pool.run(&|i| {
            assert_eq!(i, 0);
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 1);
    }
}
