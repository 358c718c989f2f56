//! Memory accounting by purpose. Every buffer a backend hands out carries a [`MemoryTag`]; the
//! GPU backend's tags map onto rocm-alloc's, and the CPU backend keeps the same books so the
//! report reads the same on either.

use std::fmt;

/// What a buffer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemoryTag {
    /// Model weights, resident for the model's lifetime.
    Weights,
    /// Keys and values of past positions, sized from the requested context.
    KvCache,
    /// Per-step activations, allocated once for the largest batch and reused.
    Activations,
    /// Scratch for kernels (quantized activations, partial results).
    Workspace,
}

impl MemoryTag {
    pub const ALL: [MemoryTag; 4] = [
        MemoryTag::Weights,
        MemoryTag::KvCache,
        MemoryTag::Activations,
        MemoryTag::Workspace,
    ];

    pub fn name(self) -> &'static str {
        match self {
            MemoryTag::Weights => "weights",
            MemoryTag::KvCache => "kv_cache",
            MemoryTag::Activations => "activations",
            MemoryTag::Workspace => "workspace",
        }
    }
}

/// Bytes in use per tag, and where they live.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// "host" or a device name.
    pub location: String,
    /// Bytes per tag, in [`MemoryTag::ALL`] order.
    pub bytes: [u64; 4],
}

impl MemoryReport {
    pub fn get(&self, tag: MemoryTag) -> u64 {
        self.bytes[tag as usize]
    }

    pub fn add(&mut self, tag: MemoryTag, bytes: u64) {
        self.bytes[tag as usize] += bytes;
    }

    pub fn total(&self) -> u64 {
        self.bytes.iter().sum()
    }
}

/// Formats bytes with a binary unit, e.g. `241.3 MiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} memory: {} total (",
            self.location,
            human_bytes(self.total())
        )?;
        for (i, tag) in MemoryTag::ALL.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{} {}", tag.name(), human_bytes(self.get(*tag)))?;
        }
        write!(f, ")")
    }
}

/// The allocator tag a GPU backend requests each kind of buffer under.
impl From<MemoryTag> for rocm_alloc::Tag {
    fn from(t: MemoryTag) -> rocm_alloc::Tag {
        match t {
            MemoryTag::Weights => rocm_alloc::Tag::Weights,
            MemoryTag::KvCache => rocm_alloc::Tag::KvCache,
            MemoryTag::Activations => rocm_alloc::Tag::Activations,
            MemoryTag::Workspace => rocm_alloc::Tag::Workspace,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_sums_and_formats_per_tag() {
        let mut r = MemoryReport {
            location: "host".into(),
            ..Default::default()
        };
        r.add(MemoryTag::Weights, 3 << 20);
        r.add(MemoryTag::KvCache, 512);
        assert_eq!(r.total(), (3 << 20) + 512);
        let s = r.to_string();
        assert!(s.contains("weights 3.0 MiB"), "{s}");
        assert!(s.contains("kv_cache 512 B"), "{s}");
    }
}
