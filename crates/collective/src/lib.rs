//! Collectives for tensor-parallel runs: the sums and gathers that join the partial results of
//! a model split over several ranks (one GPU each, or one thread each on the CPU).
//!
//! [`Collective`] is what a rank's backend calls: an all-reduce (sum) and an all-gather over
//! one buffer. Two implementations sit behind it:
//! - [`in_process`]: ranks that are threads of one process, over host memory. CPU tests run a
//!   split model through it, so the split logic is checked without a GPU.
//! - [`library`]: NCCL on NVIDIA or RCCL on AMD (they share one API), loaded at run time like
//!   the HIP and CUDA runtimes. A missing library is a reason string, never a panic.
//!   [`device`] is one rank's communicator over it: sums and gathers of device buffers, queued
//!   on a stream, with the library's asynchronous error query and abort.
//!
//! A rank that fails must not leave the others waiting: [`Collective::abort`] ends every
//! rank's current and later collectives with its reason, and a rank that waits longer than its
//! group's timeout for the others ends the group the same way.

pub mod device;
pub mod in_process;
pub mod library;

use thiserror::Error;

/// Why a collective did not complete.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CollectiveError {
    /// Another rank (or this one) stopped the group.
    #[error("rank {rank} stopped the group: {reason}")]
    Aborted { rank: usize, reason: String },
    /// The other ranks did not arrive in time.
    #[error(
        "rank {rank} waited {waited_ms} ms for ranks {missing:?} at collective {round}; the \
         group is stopped (a rank failed or hangs)"
    )]
    Timeout {
        rank: usize,
        round: u64,
        missing: Vec<usize>,
        waited_ms: u64,
    },
    /// The ranks called different collectives, or with different lengths.
    #[error("rank {rank} called {got} at collective {round} where rank {first} called {want}")]
    Mismatch {
        rank: usize,
        first: usize,
        round: u64,
        got: String,
        want: String,
    },
    /// A buffer of the wrong length for the collective.
    #[error("{0}")]
    Length(String),
    /// The collective library is missing or failed.
    #[error("{0}")]
    Library(String),
}

/// One rank's end of a group of ranks that run collectives together. Every rank calls the same
/// collectives in the same order with buffers of the same length.
pub trait Collective: Send {
    /// This rank's index, `0..ranks()`.
    fn rank(&self) -> usize;
    /// How many ranks the group has.
    fn ranks(&self) -> usize;
    /// Replaces `values` on every rank by their element-wise sum over the ranks, added in rank
    /// order, so every rank holds the same bits.
    fn all_reduce_sum(&mut self, values: &mut [f32]) -> Result<(), CollectiveError>;
    /// Writes every rank's `mine` into `out`, rank 0's first; `out` holds `ranks()` times as
    /// many values as `mine`.
    fn all_gather(&mut self, mine: &[f32], out: &mut [f32]) -> Result<(), CollectiveError>;
    /// Stops the group: every rank's current and later collectives fail with `reason`.
    fn abort(&mut self, reason: &str);
}

#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
