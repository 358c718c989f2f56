//! Streamed prefetch: weight rows that live in pinned host memory are copied by the copy
//! engine into one of two device slots, on a stream of their own, while the compute stream
//! works on the other slot.
//!
//! Prefill reads every weight once per chunk. Read in place (zero-copy), the dequantizing
//! kernel waits on the link while the matrix cores idle, and the product waits for it; staged,
//! the copy of the next block overlaps the dequantization and product of this one, so a chunk
//! costs about the link time of its weights instead of link time plus compute time. The copy
//! engine also moves bulk bytes at a higher rate than a kernel's scattered zero-copy reads.
//!
//! The ordering between the two streams is two events per slot:
//! - `copied[s]`, recorded on the copy stream after the slot is filled; the compute stream
//!   waits for it before reading the slot;
//! - `released[s]`, recorded on the compute stream after the last read of the slot; the copy
//!   stream waits for it before filling the slot again.
//!
//! Both slots are the allocator's (tag `offload_staging`), taken once before the first step and
//! counted in the plan's resident needs, so streaming never allocates while a run is going.

use crate::backend::gpu::error::kerr;
use crate::error::{DecodeError, Result};
use gguf_loader::GgmlType;
use hip_ffi::{DevicePtr, Event, Stream};
use rocm_alloc::{fmt_bytes, Allocation, Allocator, StreamId, Tag};
use rocm_kernels::ops::matvec::QuantMatrix;
use rocm_kernels::DeviceSlice;

pub static OFFLOAD_PREFILL: knobs::Knob<HostPrefill> = knobs::Knob {
    name: "HIPDECODE_OFFLOAD_PREFILL",
    default: "stream",
    doc: "how prefill reads weights left in host memory: `stream` (copied into device slots \
          ahead of use) or `in-place` (read over the link by the kernel)",
    scope: knobs::Scope::Run,
    parse: |v| {
        knobs::parse::choice(
            v,
            &[
                ("stream", HostPrefill::Stream),
                ("in-place", HostPrefill::InPlace),
            ],
        )
    },
};

/// How prefill products read a weight in pinned host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostPrefill {
    /// Copied block by block into device slots ahead of use (the default).
    Stream,
    /// Read in place over the link by the dequantizing kernel.
    InPlace,
}

/// The two slots, the copy stream and the events that order them.
pub(crate) struct Prefetch {
    pub(crate) slots: [Allocation; 2],
    pub(crate) slot_bytes: usize,
    pub(crate) copy: Stream,
    pub(crate) copied: [Event; 2],
    pub(crate) released: [Event; 2],
    /// Whether `released[s]` has been recorded since the slot was last filled (a slot handed
    /// out and not yet released is a bug in the caller).
    pub(crate) pending_release: [bool; 2],
    pub(crate) next: usize,
    pub(crate) staged_bytes: u64,
    pub(crate) staged_blocks: u64,
}

/// A slot holding staged rows: read it on the compute stream, then hand it to
/// [`Prefetch::release`].
#[derive(Debug)]
pub(crate) struct Staged {
    pub(crate) slot: usize,
    /// Device address of the copied bytes.
    pub(crate) ptr: DevicePtr,
    /// How many bytes were copied.
    pub(crate) bytes: usize,
}

impl Staged {
    /// The staged bytes as a `rows` x `cols` matrix of `format`, for kernels queued on the
    /// compute stream before the slot's [`Prefetch::release`].
    pub(crate) fn matrix(&self, format: GgmlType, rows: usize, cols: usize) -> Result<QuantMatrix> {
        // SAFETY: the slot holds `bytes` copied bytes, which the compute stream reads only
        // after the copy (`stage` made it wait), and the slot is not refilled before the
        // release that the caller records after its last kernel over this view.
        let data = unsafe { DeviceSlice::<u8>::from_raw(self.ptr.0, self.bytes) };
        QuantMatrix::new(data, format, rows, cols).map_err(kerr("a staged weight block"))
    }
}

impl Prefetch {
    /// Takes two slots of `slot_bytes` from `alloc` on the compute stream `stream_id`, and a
    /// copy stream on the compute stream's device.
    pub(crate) fn new(
        alloc: &Allocator,
        stream_id: StreamId,
        compute: &Stream,
        slot_bytes: usize,
    ) -> Result<Prefetch> {
        let take = || {
            alloc
                .alloc(slot_bytes.max(1) as u64, stream_id, Tag::OffloadStaging)
                .map_err(|e| DecodeError::Allocation {
                    what: format!(
                        "a streamed-prefetch slot of {}",
                        fmt_bytes(slot_bytes as u64)
                    ),
                    reason: e.to_string(),
                })
        };
        let device = compute.device();
        let event =
            || Event::new_without_timing(device).map_err(kerr("streamed prefetch: an event"));
        Ok(Prefetch {
            slots: [take()?, take()?],
            slot_bytes,
            copy: Stream::new(device).map_err(kerr("streamed prefetch: the copy stream"))?,
            copied: [event()?, event()?],
            released: [event()?, event()?],
            pending_release: [false; 2],
            next: 0,
            staged_bytes: 0,
            staged_blocks: 0,
        })
    }

    /// Bytes one slot holds.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Queues the copy of `host` into the next slot and makes `compute` wait for it.
    ///
    /// # Safety
    /// `host` is pinned host memory that stays alive and unchanged until the copy has run
    /// (a model's pinned weights do: they are freed with the backend, whose drop waits for the
    /// device).
    pub(crate) unsafe fn stage(&mut self, compute: &Stream, host: &[u8]) -> Result<Staged> {
        if host.len() > self.slot_bytes {
            return Err(DecodeError::InvalidArgument(format!(
                "streamed prefetch: a block of {} does not fit a slot of {}",
                fmt_bytes(host.len() as u64),
                fmt_bytes(self.slot_bytes as u64)
            )));
        }
        let s = self.next;
        if self.pending_release[s] {
            return Err(DecodeError::InvalidArgument(
                "streamed prefetch: a slot was staged again before it was released".into(),
            ));
        }
        // The slot's previous reader must be done; an event never recorded counts as done.
        self.copy
            .wait_event(&self.released[s])
            .map_err(kerr("streamed prefetch: waiting for the slot's release"))?;
        let dst = DevicePtr(self.slots[s].ptr());
        // SAFETY: the slot holds `slot_bytes >= host.len()` bytes and stays allocated as long
        // as `self` (whose drop waits for the copy stream); the caller vouches for `host`; the
        // wait above orders the copy after every read of the slot's previous contents.
        unsafe { self.copy.copy_from_host_raw(dst, host) }
            .map_err(kerr("streamed prefetch: the copy"))?;
        self.copied[s]
            .record(&self.copy)
            .map_err(kerr("streamed prefetch: recording the copy"))?;
        compute
            .wait_event(&self.copied[s])
            .map_err(kerr("streamed prefetch: waiting for the copy"))?;
        self.pending_release[s] = true;
        self.next ^= 1;
        self.staged_bytes += host.len() as u64;
        self.staged_blocks += 1;
        Ok(Staged {
            slot: s,
            ptr: dst,
            bytes: host.len(),
        })
    }

    /// Marks the end of `compute`'s reads of `staged`: the slot may be filled again after
    /// them.
    pub(crate) fn release(&mut self, compute: &Stream, staged: Staged) -> Result<()> {
        self.released[staged.slot]
            .record(compute)
            .map_err(kerr("streamed prefetch: releasing a slot"))?;
        self.pending_release[staged.slot] = false;
        Ok(())
    }

    /// One line for the device report.
    pub(crate) fn report_line(&self) -> String {
        format!(
            "streamed prefetch: 2 slots of {}; {} copied in {} blocks",
            fmt_bytes(self.slot_bytes as u64),
            fmt_bytes(self.staged_bytes),
            self.staged_blocks
        )
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        // The slots go back to the allocator on the compute stream, which has waited for every
        // copy it read; a copy still running would be one nobody waited for, so finish them.
        // A failure here means the device is lost, and its memory with it.
        let _ = self.copy.synchronize();
    }
}
