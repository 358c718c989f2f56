//! A point-in-time listing of every segment and block, serializable to JSON, for finding where
//! memory went (a buffer stranded in a side stream's pool shows up here with its stream and
//! tag).

use serde::Serialize;

use crate::block_pool::{BlockPool, BlockState, GraphPoolId, PoolOwner};
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

/// Everything the allocator holds at one moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    /// Backend name.
    pub device: String,
    /// Counters at the same moment.
    pub stats: Stats,
    /// Segments in address order.
    pub segments: Vec<SegmentInfo>,
    /// Blocks stuck after an event failure (they also appear in `segments` as pending frees).
    pub stuck_blocks: Vec<StuckBlock>,
}

impl Snapshot {
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
