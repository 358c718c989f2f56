//! A point-in-time listing of every segment and block, serializable to JSON, for finding where
//! memory went (a buffer stranded in a side stream's pool shows up here with its stream and
//! tag).

use serde::Serialize;

use crate::block::BlockState;
use crate::block_pool::{BlockPool, GraphPoolId, PoolOwner};
use crate::deferred::StuckFree;
use crate::device::StreamId;
use crate::stats::Stats;
use crate::tag::Tag;

/// Which pool a segment belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolName {
    /// The ordinary cache of a stream.
    Stream,
    /// A graph's private pool.
    Graph(GraphPoolId),
}

/// One block of a segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BlockInfo {
    /// Device address.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// State.
    pub state: BlockState,
    /// Stream the block belongs to.
    pub stream: StreamId,
    /// Tag of the last allocation that used it (meaningful for active and pending blocks).
    pub tag: Option<Tag>,
    /// Pool of the segment.
    pub pool: PoolName,
    /// Other streams recorded as using it (pending frees wait on them).
    pub stream_uses: Vec<StreamId>,
}

/// One device allocation and its blocks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentInfo {
    /// Device address.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Stream that owns it.
    pub stream: StreamId,
    /// "small" or "large".
    pub size_class: &'static str,
    /// Pool.
    pub pool: PoolName,
    /// Blocks in address order; they tile the segment exactly.
    pub blocks: Vec<BlockInfo>,
}

/// A block kept out of reuse for good because an event call for it failed: the allocator can
/// never know when the other stream is done with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StuckBlock {
    /// Device address of the block.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Stream the block belongs to.
    pub stream: StreamId,
    /// The other stream whose event could not be recorded, queried or waited on.
    pub event_stream: StreamId,
    /// The device's error.
    pub error: String,
}

/// Why a block is listed as stranded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StrandedReason {
    /// Its stream was retired ([`crate::Allocator::retire_stream`]): nothing will run on it
    /// again, so nothing will reuse or release the block through that stream.
    RetiredStream,
    /// Cached (free or pending) in the pool of a stream other than the main one
    /// ([`crate::Allocator::set_main_stream`]): only that stream can reuse it.
    SideStreamCache,
}

/// A block held in a pool where the main stream cannot reuse it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StrandedBlock {
    /// Device address.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Stream whose pool holds it.
    pub stream: StreamId,
    /// State.
    pub state: BlockState,
    /// Pool of its segment.
    pub pool: PoolName,
    /// Tag of the allocation that holds or held it (`None` for free blocks).
    pub tag: Option<Tag>,
    /// Why it is listed.
    pub reason: StrandedReason,
}

/// Which stream is the main one and which are retired (set by the runtime).
#[derive(Clone, Debug, Default)]
pub(crate) struct StreamRoles {
    pub main: Option<StreamId>,
    pub retired: Vec<StreamId>,
}

/// Everything the allocator holds at one moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    /// Backend name.
    pub device: String,
    /// Counters at the same moment.
    pub stats: Stats,
    /// Segments in address order.
    pub segments: Vec<SegmentInfo>,
    /// Bytes mapped into growable regions, per tag in [`Tag::ALL`] order (outside the
    /// segments).
    pub mapped_by_tag: Vec<(Tag, u64)>,
    /// The main stream, if the runtime named one.
    pub main_stream: Option<StreamId>,
    /// Blocks the main stream cannot reuse: every block of a retired stream, and the free or
    /// pending blocks cached on a stream other than the main one. Empty when no main stream is
    /// named and none is retired.
    pub stranded: Vec<StrandedBlock>,
    /// Blocks stuck after an event failure (they also appear in `segments` as pending frees).
    pub stuck_blocks: Vec<StuckBlock>,
}

impl Snapshot {
    /// Bytes of [`Snapshot::stranded`] per stream, streams in ascending order.
    pub fn stranded_bytes_by_stream(&self) -> Vec<(StreamId, u64)> {
        let mut out: Vec<(StreamId, u64)> = Vec::new();
        for b in &self.stranded {
            match out.iter_mut().find(|(s, _)| *s == b.stream) {
                Some((_, bytes)) => *bytes += b.size,
                None => out.push((b.stream, b.size)),
            }
        }
        out.sort_by_key(|(s, _)| *s);
        out
    }

    /// One line per stream holding stranded bytes, for a human; empty when none.
    pub fn stranded_report(&self) -> String {
        self.stranded_bytes_by_stream()
            .into_iter()
            .map(|(stream, bytes)| {
                let n = self.stranded.iter().filter(|b| b.stream == stream).count();
                format!(
                    "stranded: {} in {n} block(s) on stream {}\n",
                    crate::oom::fmt_bytes(bytes),
                    stream.value()
                )
            })
            .collect()
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("snapshot types serialize infallibly")
    }
}

pub(crate) fn stuck_block(pool: &BlockPool, stuck: &StuckFree) -> StuckBlock {
    let b = pool.block(stuck.block);
    StuckBlock {
        address: b.addr,
        size: b.size,
        stream: pool.segment(b.segment).pool.stream,
        event_stream: stuck.stream,
        error: stuck.error.to_string(),
    }
}

pub(crate) fn segments(pool: &BlockPool) -> Vec<SegmentInfo> {
    pool.walk()
        .into_iter()
        .map(|(sid, blocks)| {
            let seg = pool.segment(sid);
            let pname = match seg.pool.owner {
                PoolOwner::Default => PoolName::Stream,
                PoolOwner::Graph(g) => PoolName::Graph(g),
            };
            SegmentInfo {
                address: seg.addr,
                size: seg.size,
                stream: seg.pool.stream,
                size_class: seg.pool.kind.name(),
                pool: pname.clone(),
                blocks: blocks
                    .into_iter()
                    .map(|bid| {
                        let b = pool.block(bid);
                        BlockInfo {
                            address: b.addr,
                            size: b.size,
                            state: b.state,
                            stream: seg.pool.stream,
                            tag: (b.state != BlockState::Free).then_some(b.tag),
                            pool: pname.clone(),
                            stream_uses: b.stream_uses.clone(),
                        }
                    })
                    .collect(),
            }
        })
        .collect()
}

pub(crate) fn stranded(pool: &BlockPool, roles: &StreamRoles) -> Vec<StrandedBlock> {
    let mut out = Vec::new();
    for seg in segments(pool) {
        let retired = roles.retired.contains(&seg.stream);
        let side = roles.main.is_some_and(|m| m != seg.stream);
        for b in seg.blocks {
            let reason = if retired {
                StrandedReason::RetiredStream
            } else if side && b.state != BlockState::Active {
                StrandedReason::SideStreamCache
            } else {
                continue;
            };
            out.push(StrandedBlock {
                address: b.address,
                size: b.size,
                stream: b.stream,
                state: b.state,
                pool: b.pool,
                tag: b.tag,
                reason,
            });
        }
    }
    out
}
