//! The report attached to an out-of-memory error: what was asked, where the memory is, and
//! what to do about it.

use std::fmt;

use serde::Serialize;

use crate::tag::Tag;

/// Why the allocation could not be satisfied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OomCause {
    /// Growing would exceed the memory limit.
    MemoryLimit,
    /// The device itself refused the allocation.
    Device,
}

/// Breakdown of memory at the moment an allocation failed for good (after flushing the cache
/// and waiting on pending events).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OomReport {
    /// Bytes the caller asked for.
    pub requested: u64,
    /// Size of the segment the allocator tried to obtain.
    pub segment: u64,
    /// What refused.
    pub cause: OomCause,
    /// Bytes in active blocks.
    pub active: u64,
    /// Bytes reserved but not active (fragmentation and graph pools; the idle part was flushed).
    pub cached: u64,
    /// Bytes reserved from the device.
    pub reserved: u64,
    /// The memory limit (`None` = unbounded).
    pub limit: Option<u64>,
    /// Free bytes the device reported, when it could be asked (not during a graph capture).
    pub device_free: Option<u64>,
    /// A graph capture was active: the cache was not flushed and pending frees were not waited
    /// on, because both are illegal during capture.
    pub capture_active: bool,
    /// Active bytes per tag, largest first, zero entries omitted.
    pub per_tag: Vec<(Tag, u64)>,
    /// A suggestion for the user.
    pub hint: String,
}

impl OomReport {
    pub(crate) fn hint_for(
        cause: OomCause,
        requested: u64,
        per_tag: &[(Tag, u64)],
        cached: u64,
        capture_active: bool,
    ) -> String {
        let top = per_tag
            .first()
            .map(|(t, b)| format!("{t} holds the most ({})", fmt_bytes(*b)));
        let mut h = match cause {
            OomCause::MemoryLimit => format!(
                "the allocator's memory limit stops this {}-byte request; raise it with \
                 {} (e.g. \"95%\") or Allocator::set_memory_limit if the device has room",
                requested,
                crate::knobs::MEMORY_LIMIT.name
            ),
            OomCause::Device => {
                "the device has no more memory; reduce the context length, the batch, or \
                                 offload weights to host memory"
                    .to_string()
            }
        };
        if capture_active {
            h.push_str(
                "; a graph capture is active, so cached memory was not returned to the device and \
                 pending frees were not waited on (both are illegal during capture): end the \
                 capture and retry, or allocate the graph's buffers before capturing",
            );
        }
        if let Some(top) = top {
            h.push_str("; ");
            h.push_str(&top);
        }
        if cached > requested {
            h.push_str("; free bytes exist but are fragmented inside partly used segments (see the snapshot)");
        }
        h
    }
}

/// Formats a byte count with a binary unit and two decimals, e.g. `241.25 MiB`.
pub fn fmt_bytes(b: u64) -> String {
    fmt_bytes_decimals(b, 2)
}

/// Formats a byte count with a binary unit and `decimals` decimals (whole bytes below 1 KiB):
/// the one byte formatter of the workspace, which every report uses.
pub fn fmt_bytes_decimals(b: u64, decimals: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.decimals$} {}", UNITS[u])
    }
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "requested {} (segment {}): active {}, cached {}, reserved {}, limit {}",
            fmt_bytes(self.requested),
            fmt_bytes(self.segment),
            fmt_bytes(self.active),
            fmt_bytes(self.cached),
            fmt_bytes(self.reserved),
            self.limit.map_or("none".to_string(), fmt_bytes),
        )?;
        if let Some(free) = self.device_free {
            write!(f, ", device free {}", fmt_bytes(free))?;
        }
        if !self.per_tag.is_empty() {
            f.write_str("; by tag:")?;
            for (t, b) in &self.per_tag {
                write!(f, " {t}={}", fmt_bytes(*b))?;
            }
        }
        write!(f, ". Hint: {}", self.hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_format() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(3 << 29), "1.50 GiB");
    }

    #[test]
    fn hint_names_the_knob_and_the_biggest_tag() {
        let h = OomReport::hint_for(
            OomCause::MemoryLimit,
            10,
            &[(Tag::KvCache, 1 << 30)],
            0,
            false,
        );
        assert!(h.contains("HIPDECODE_MEMORY_LIMIT"));
        assert!(h.contains("kv_cache holds the most (1.00 GiB)"));
    }
}
