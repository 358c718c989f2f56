//! An optional bounded trace of allocator events. Off by default; when off the allocator
//! checks one `Option` and records nothing.

use std::collections::VecDeque;
use std::time::Instant;

use serde::Serialize;

use crate::device::StreamId;
use crate::tag::Tag;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceKind {
    /// A user allocation was handed out.
    Alloc,
    /// A user allocation was freed (possibly deferred behind other streams).
    Free,
    /// A segment was obtained from the device.
    DeviceAlloc,
    /// A segment was returned to the device.
    DeviceFree,
}

/// One recorded event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TraceEvent {
    /// Nanoseconds since tracing was enabled.
    pub t_ns: u64,
    /// What happened.
    pub kind: TraceKind,
    /// Device address.
    pub addr: u64,
    /// Bytes (block size for user events, segment size for device events).
    pub size: u64,
    /// Tag of the allocation (`other` for device events).
    pub tag: Tag,
    /// Stream of the allocation.
    pub stream: StreamId,
}

/// Ring buffer keeping the most recent `capacity` events.
#[derive(Debug)]
pub(crate) struct Trace {
    start: Instant,
    capacity: usize,
    events: VecDeque<TraceEvent>,
    dropped: u64,
}

impl Trace {
    pub fn new(capacity: usize) -> Trace {
        Trace {
            start: Instant::now(),
            capacity: capacity.max(1),
            events: VecDeque::with_capacity(capacity.max(1)),
            dropped: 0,
        }
    }

    pub fn record(&mut self, kind: TraceKind, addr: u64, size: u64, tag: Tag, stream: StreamId) {
        if self.events.len() == self.capacity {
            self.events.pop_front();
            self.dropped += 1;
        }
        let t_ns = self.start.elapsed().as_nanos() as u64;
        self.events.push_back(TraceEvent {
            t_ns,
            kind,
            addr,
            size,
            tag,
            stream,
        });
    }

    /// Removes and returns the recorded events and the number dropped for lack of room.
    pub fn take(&mut self) -> (Vec<TraceEvent>, u64) {
        let dropped = std::mem::take(&mut self.dropped);
        (self.events.drain(..).collect(), dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_most_recent_events() {
        let mut t = Trace::new(2);
        for addr in 1..=3 {
            t.record(TraceKind::Alloc, addr, 512, Tag::Other, StreamId::DEFAULT);
        }
        let (events, dropped) = t.take();
        assert_eq!(dropped, 1);
        assert_eq!(
            events.iter().map(|e| e.addr).collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert!(events[0].t_ns <= events[1].t_ns);
    }
}
