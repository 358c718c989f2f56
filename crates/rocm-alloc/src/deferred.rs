//! Deferred frees for blocks used by more than one stream (`record_stream`).
//!
//! When such a block is freed, an event is recorded on every other stream that used it; the
//! block stays `PendingFree` (not reusable) until all those events complete. Completion is
//! polled at the start of each allocation while anything is pending, and waited for on the
//! out-of-memory path.

use crate::block_pool::BlockId;
use crate::device::{EventId, RawDevice};

/// One block waiting for other streams.
#[derive(Debug)]
pub(crate) struct PendingFree {
    pub block: BlockId,
    pub events: Vec<EventId>,
    /// An event could not be recorded, so completion can never be known; the block is kept
    /// (visible in snapshots) rather than risk reusing memory another stream still reads.
    pub stuck: bool,
}

#[derive(Debug, Default)]
pub(crate) struct PendingFrees {
    entries: Vec<PendingFree>,
}

impl PendingFrees {
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn push(&mut self, entry: PendingFree) {
        self.entries.push(entry);
    }

    /// Removes and returns the blocks whose events have all completed. With `wait`, blocks
    /// until every non-stuck entry completes. Completed events are destroyed.
    pub fn collect_done(
        &mut self,
        device: &dyn RawDevice,
        wait: bool,
    ) -> Result<Vec<BlockId>, crate::device::DeviceError> {
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.entries.len() {
            let e = &self.entries[i];
            let mut complete = !e.stuck;
            if complete {
                for &ev in &e.events {
                    if wait {
                        device.event_wait(ev)?;
                    } else if !device.event_complete(ev)? {
                        complete = false;
                        break;
                    }
                }
            }
            if complete {
                let e = self.entries.swap_remove(i);
                for ev in e.events {
                    device.destroy_event(ev);
                }
                done.push(e.block);
            } else {
                i += 1;
            }
        }
        Ok(done)
    }

    /// Destroys every event (used when the allocator is dropped).
    pub fn destroy_all(&mut self, device: &dyn RawDevice) -> Vec<BlockId> {
        self.entries
            .drain(..)
            .map(|e| {
                for ev in e.events {
                    device.destroy_event(ev);
                }
                e.block
            })
            .collect()
    }
}
