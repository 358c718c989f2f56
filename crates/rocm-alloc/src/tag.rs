//! What an allocation is for. Every byte the allocator hands out carries one of these tags so
//! the statistics can say which part of the runtime holds it.

use serde::Serialize;

/// The purpose of an allocation, used for per-purpose accounting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tag {
    /// Model weights (quantized blocks, norms, embeddings).
    Weights,
    /// Key/value cache pages.
    KvCache,
    /// Per-step activations and the decode arena.
    Activations,
    /// Scratch space for kernels (reductions, GEMM workspaces).
    Workspace,
    /// Memory owned by a captured graph's private pool.
    Graph,
    /// Device-side staging buffers for weights offloaded to host memory.
    OffloadStaging,
    /// Anything else.
    Other,
}

impl Tag {
    /// Number of tags; the length of per-tag tables.
    pub const COUNT: usize = 7;

    /// Every tag, in table order.
    pub const ALL: [Tag; Tag::COUNT] = [
        Tag::Weights,
        Tag::KvCache,
        Tag::Activations,
        Tag::Workspace,
        Tag::Graph,
        Tag::OffloadStaging,
        Tag::Other,
    ];

    /// Position of this tag in per-tag tables.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The snake_case name used in JSON and reports.
    pub fn name(self) -> &'static str {
        match self {
            Tag::Weights => "weights",
            Tag::KvCache => "kv_cache",
            Tag::Activations => "activations",
            Tag::Workspace => "workspace",
            Tag::Graph => "graph",
            Tag::OffloadStaging => "offload_staging",
            Tag::Other => "other",
        }
    }
}

impl std::fmt::Display for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_order_matches_index() {
        for (i, t) in Tag::ALL.iter().enumerate() {
            assert_eq!(t.index(), i);
        }
    }

    #[test]
    fn json_name_matches_display() {
        for t in Tag::ALL {
            let json = serde_json::to_string(&t).unwrap();
            assert_eq!(json, format!("\"{}\"", t.name()));
        }
    }
}
