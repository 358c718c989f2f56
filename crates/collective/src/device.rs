//! One rank's NCCL or RCCL communicator: collectives on device buffers, queued on a stream.
//!
//! Rank 0 makes a [`UniqueId`] and every rank of the group is given it (threads of one process
//! share it directly). Each rank then joins with [`DeviceComm::join`] on its own device, with
//! that device current on the calling thread: the library takes the device from the runtime,
//! as the HIP and CUDA runtimes define it. Joining waits for every rank, so the ranks join
//! concurrently.
//!
//! A failed rank must not leave the others waiting. [`DeviceComm::check_async`] reads the
//! library's asynchronous error (a peer's failure, a network error), and [`DeviceComm::abort`]
//! ends the communicator without waiting for the others: a watchdog that sees an error or a
//! stall aborts, and every rank's queued collectives then end with an error.

use crate::library::{Entries, Library, RawComm, RawUniqueId, NCCL_FLOAT32, NCCL_SUM};
use crate::CollectiveError;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// The 128 bytes that name a group: made once by rank 0 and handed to every rank.
#[derive(Clone, Copy)]
pub struct UniqueId(RawUniqueId);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The bytes hold a socket address; nothing to show.
        f.write_str("UniqueId(..)")
    }
}

impl UniqueId {
    /// A new group's id (`ncclGetUniqueId`).
    pub fn new(library: &Library) -> Result<UniqueId, CollectiveError> {
        let entries = library.entries()?;
        let mut raw = RawUniqueId { internal: [0; 128] };
        // SAFETY: writes the 128 bytes of `raw`, which lives across the call.
        let result = unsafe { (entries.get_unique_id)(&mut raw) };
        library.check("ncclGetUniqueId", result)?;
        Ok(UniqueId(raw))
    }
}

/// One rank's end of a device communicator.
pub struct DeviceComm {
    library: Arc<Library>,
    entries: Entries,
    comm: RawComm,
    rank: usize,
    ranks: usize,
    /// Set by [`DeviceComm::abort`]: the handle is gone.
    aborted: bool,
}

// SAFETY: an ncclComm_t may be used from any thread, one call at a time; `&mut self` on every
// collective keeps calls on one handle from overlapping.
unsafe impl Send for DeviceComm {}

impl DeviceComm {
    /// Joins group `id` as `rank` of `ranks` on the device current on this thread
    /// (`ncclCommInitRank`). Returns once every rank has joined, or with the library's error.
    pub fn join(
        library: Arc<Library>,
        id: &UniqueId,
        rank: usize,
        ranks: usize,
    ) -> Result<DeviceComm, CollectiveError> {
        if ranks == 0 || rank >= ranks {
            return Err(CollectiveError::Length(format!(
                "rank {rank} of {ranks}: a rank is below the group's count, which is at least 1"
            )));
        }
        let too_many = |_| CollectiveError::Length(format!("{ranks} ranks are too many"));
        let (rank_c, ranks_c) = (
            c_int::try_from(rank).map_err(too_many)?,
            c_int::try_from(ranks).map_err(too_many)?,
        );
        let entries = library.entries()?;
        let mut comm: RawComm = std::ptr::null_mut();
        // SAFETY: writes one handle into `comm`; the id is passed by value as nccl.h declares.
        let result = unsafe { (entries.comm_init_rank)(&mut comm, ranks_c, id.0, rank_c) };
        library.check("ncclCommInitRank", result)?;
        Ok(DeviceComm {
            library,
            entries,
            comm,
            rank,
            ranks,
            aborted: false,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn ranks(&self) -> usize {
        self.ranks
    }

    fn live(&self) -> Result<RawComm, CollectiveError> {
        match self.aborted {
            true => Err(CollectiveError::Aborted {
                rank: self.rank,
                reason: "this communicator was aborted".into(),
            }),
            false => Ok(self.comm),
        }
    }

    /// Queues on `stream` the element-wise sum over the ranks of `count` f32 at `send`, written
    /// to `recv` on every rank (the same address is allowed: in place). Every rank holds the
    /// same bits; the order of the additions is the library's.
    ///
    /// # Safety
    /// `send` and `recv` are device addresses of at least `count` f32 on this rank's device,
    /// valid until the stream has run the collective; `stream` is a live stream of that
    /// device (a `cudaStream_t` or `hipStream_t`), or null for the default stream.
    pub unsafe fn all_reduce_sum_f32(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        stream: *mut c_void,
    ) -> Result<(), CollectiveError> {
        let comm = self.live()?;
        // SAFETY: the caller's contract above; `comm` is live.
        let result = unsafe {
            (self.entries.all_reduce)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                NCCL_FLOAT32,
                NCCL_SUM,
                comm,
                stream,
            )
        };
        self.library.check("ncclAllReduce", result)
    }

    /// Queues on `stream` the gather of every rank's `count` f32 at `send` into `recv`, rank 0's
    /// first, on every rank.
    ///
    /// # Safety
    /// As [`DeviceComm::all_reduce_sum_f32`], with `recv` holding `count * ranks()` f32 and not
    /// overlapping `send` unless `send` is this rank's place in it.
    pub unsafe fn all_gather_f32(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        stream: *mut c_void,
    ) -> Result<(), CollectiveError> {
        let comm = self.live()?;
        // SAFETY: the caller's contract above; `comm` is live.
        let result = unsafe {
            (self.entries.all_gather)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                NCCL_FLOAT32,
                comm,
                stream,
            )
        };
        self.library.check("ncclAllGather", result)
    }

    /// The library's asynchronous error for this communicator (`ncclCommGetAsyncError`): `Ok`
    /// while it has none or an operation is still in progress.
    pub fn check_async(&self) -> Result<(), CollectiveError> {
        let comm = self.live()?;
        let mut state: c_int = 0;
        // SAFETY: `comm` is live; writes one int.
        let result = unsafe { (self.entries.comm_get_async_error)(comm, &mut state) };
        self.library.check("ncclCommGetAsyncError", result)?;
        match state {
            // ncclInProgress: a non-blocking communicator still working.
            0 | 7 => Ok(()),
            failed => self.library.check("a queued collective", failed),
        }
    }

    /// Ends the communicator at once, without waiting for the other ranks
    /// (`ncclCommAbort`): its queued collectives end, and later calls fail with
    /// [`CollectiveError::Aborted`].
    pub fn abort(&mut self) -> Result<(), CollectiveError> {
        let comm = self.live()?;
        self.aborted = true;
        // SAFETY: `comm` is live, and is not used again (`aborted`).
        let result = unsafe { (self.entries.comm_abort)(comm) };
        self.library.check("ncclCommAbort", result)
    }
}

impl Drop for DeviceComm {
    fn drop(&mut self) {
        if self.aborted {
            return;
        }
        // SAFETY: the handle is live and dropped once. ncclCommDestroy waits for the
        // communicator's queued work; an error here has nowhere to go but the log.
        let result = unsafe { (self.entries.comm_destroy)(self.comm) };
        if let Err(e) = self.library.check("ncclCommDestroy", result) {
            tracing::warn!(rank = self.rank, ranks = self.ranks, "{e}");
        }
    }
}
