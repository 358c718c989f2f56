//! Deferred frees for blocks used by more than one stream (`record_stream`).
//!
//! When such a block is freed, an event is recorded on every other stream that used it; the
//! block stays `PendingFree` (not reusable) until all those events complete. Completion is
//! polled at the start of each allocation while anything is pending, and waited for on the
//! out-of-memory path.
//!
//! Two things can hold a block longer:
//! - While a graph capture is active, no event may be recorded or queried, so a block freed
//!   then waits, with its stream uses, until the last capture ends; its events are recorded
//!   then.
//! - When recording, querying or waiting on one of its events fails, completion can never be
//!   known, so the block becomes *stuck*: kept out of reuse for the allocator's lifetime rather
//!   than risk handing out memory another stream may still read. The failure is returned once,
//!   naming the block and the stream, and the other entries are unaffected.

use crate::block::BlockId;
use crate::device::{DeviceError, EventId, RawDevice, StreamId};

/// One block waiting for other streams.
#[derive(Debug)]
struct PendingFree {
    block: BlockId,
    /// One event per other stream that used the block.
    events: Vec<(StreamId, EventId)>,
}

/// A block whose completion can never be known.
#[derive(Debug, Clone)]
pub(crate) struct StuckFree {
    pub block: BlockId,
    /// The stream whose event call failed.
    pub stream: StreamId,
    /// The device's error.
    pub error: DeviceError,
}

/// Result of polling or waiting: blocks now reusable, and blocks that just became stuck.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub done: Vec<BlockId>,
    pub stuck: Vec<StuckFree>,
}

#[derive(Debug, Default)]
pub(crate) struct PendingFrees {
    entries: Vec<PendingFree>,
    /// Freed during a capture; events are recorded when the last capture ends.
    awaiting_capture_end: Vec<BlockId>,
    stuck: Vec<StuckFree>,
}

impl PendingFrees {
    /// Whether any entry could still complete (stuck blocks never do, so they are not polled).
    #[inline]
    pub fn has_pollable(&self) -> bool {
        !self.entries.is_empty()
    }

    /// Blocks not reusable yet: waiting on events, on the end of a capture, or stuck.
    pub fn len(&self) -> usize {
        self.entries.len() + self.awaiting_capture_end.len() + self.stuck.len()
    }

    pub fn stuck(&self) -> &[StuckFree] {
        &self.stuck
    }

    /// Records one event per stream in `uses` for `block`. If any record fails, the block is
    /// stuck and the failure is returned (the events already recorded are destroyed).
    pub fn push(
        &mut self,
        device: &dyn RawDevice,
        block: BlockId,
        uses: &[StreamId],
    ) -> Option<StuckFree> {
        let mut events = Vec::with_capacity(uses.len());
        for &stream in uses {
            match device.record_event(stream) {
                Ok(e) => events.push((stream, e)),
                Err(error) => {
                    for (_, e) in events {
                        device.destroy_event(e);
                    }
                    let stuck = StuckFree {
                        block,
                        stream,
                        error,
                    };
                    self.stuck.push(stuck.clone());
                    return Some(stuck);
                }
            }
        }
        self.entries.push(PendingFree { block, events });
        None
    }

    /// Keeps `block` until the last capture ends (see [`PendingFrees::take_awaiting_capture_end`]).
    pub fn defer_until_capture_end(&mut self, block: BlockId) {
        self.awaiting_capture_end.push(block);
    }

    /// The blocks freed during capture, for recording their events now that it is over.
    pub fn take_awaiting_capture_end(&mut self) -> Vec<BlockId> {
        std::mem::take(&mut self.awaiting_capture_end)
    }

    /// Removes and returns the blocks whose events have all completed. With `wait`, blocks
    /// until every entry completes. Completed events are destroyed. An entry whose event call
    /// fails becomes stuck and is returned in [`Collected::stuck`]; every other entry is
    /// handled as if nothing had failed.
    pub fn collect_done(&mut self, device: &dyn RawDevice, wait: bool) -> Collected {
        let mut out = Collected::default();
        let mut i = 0;
        while i < self.entries.len() {
            match Self::poll(device, &self.entries[i], wait) {
                Ok(false) => i += 1,
                Ok(true) => {
                    let e = self.entries.swap_remove(i);
                    for (_, ev) in e.events {
                        device.destroy_event(ev);
                    }
                    out.done.push(e.block);
                }
                Err((stream, error)) => {
                    let e = self.entries.swap_remove(i);
                    for (_, ev) in e.events {
                        device.destroy_event(ev);
                    }
                    let stuck = StuckFree {
                        block: e.block,
                        stream,
                        error,
                    };
                    self.stuck.push(stuck.clone());
                    out.stuck.push(stuck);
                }
            }
        }
        out
    }

    /// Whether every event of `entry` has completed (waiting for them with `wait`), or the
    /// stream and error of the first event call that failed.
    fn poll(
        device: &dyn RawDevice,
        entry: &PendingFree,
        wait: bool,
    ) -> Result<bool, (StreamId, DeviceError)> {
        for &(stream, ev) in &entry.events {
            if wait {
                device.event_wait(ev).map_err(|e| (stream, e))?;
            } else if !device.event_complete(ev).map_err(|e| (stream, e))? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Destroys every event (used when the allocator is dropped).
    pub fn destroy_all(&mut self, device: &dyn RawDevice) {
        for e in self.entries.drain(..) {
            for (_, ev) in e.events {
                device.destroy_event(ev);
            }
        }
    }
}
