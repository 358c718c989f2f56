//! Memory accounting by purpose. Every buffer a backend hands out carries a [`MemoryTag`], which
//! is rocm-alloc's own [`rocm_alloc::Tag`]: the GPU backend passes it to the allocator as it is,
//! and the CPU backend keeps the same books so the report reads the same on either.

use std::fmt;

/// What a buffer is for: rocm-alloc's tag, so decode and the allocator share one definition.
pub use rocm_alloc::Tag as MemoryTag;

/// The tags a report always shows; the others (graph pools, offload staging, other) only when
/// they hold bytes.
const ALWAYS_SHOWN: [MemoryTag; 4] = [
    MemoryTag::Weights,
    MemoryTag::KvCache,
    MemoryTag::Activations,
    MemoryTag::Workspace,
];

/// Bytes in use per tag, and where they live.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// "host" or a device name.
    pub location: String,
    /// Bytes per tag, in [`MemoryTag::ALL`] order.
    pub bytes: [u64; MemoryTag::COUNT],
}

impl MemoryReport {
    pub fn get(&self, tag: MemoryTag) -> u64 {
        self.bytes[tag.index()]
    }

    pub fn add(&mut self, tag: MemoryTag, bytes: u64) {
        self.bytes[tag.index()] += bytes;
    }

    /// Books `bytes` of `tag` as given back.
    pub fn remove(&mut self, tag: MemoryTag, bytes: u64) {
        let held = &mut self.bytes[tag.index()];
        *held = held.saturating_sub(bytes);
    }

    pub fn total(&self) -> u64 {
        self.bytes.iter().sum()
    }
}

/// Device memory in numbers, for tools that compare phases (`bench-decode`): the allocator's
/// counters and what the runtime says the process holds on the device.
#[derive(Clone, Debug)]
pub struct DeviceMemory {
    /// The allocator's counters (per-tag current and peak, reserved, cached).
    pub stats: rocm_alloc::Stats,
    /// Device bytes the process took since the backend was created (free memory then minus
    /// free memory now, from the runtime's `mem_get_info`).
    pub process_used: u64,
    /// `process_used` minus the allocator's reserved bytes: kernel modules, graphs, runtime.
    pub outside_allocator: u64,
    /// The allocator's reserved bytes split into parts that do not overlap (per tag, graph
    /// pools, releasable cache, fragmentation slack, pending frees).
    pub breakdown: rocm_alloc::ReservedBreakdown,
    /// Bytes outside the allocator when the backend had finished starting: kernel modules,
    /// streams, events, the vendor BLAS handle.
    pub runtime_at_start: u64,
    /// What the captured decode graphs took.
    pub graph: GraphMemory,
    /// Bytes the main stream cannot reuse, per stream (the snapshot's stranded blocks).
    pub stranded: Vec<(u64, u64)>,
    /// The process's device memory as the vendor's per-process tool lists it (nvidia-smi's
    /// `used_memory`, rocm-smi's per-process VRAM): the context, kernel modules and libraries
    /// included, which `process_used` (counted from the backend's start) leaves out. The
    /// figure users compare runtimes by. `Err`: why it cannot be read here.
    pub per_process: std::result::Result<u64, String>,
}

/// What a backend can still take from its device: what a KV pool without a budget is fitted to
/// (`crate::layout::kv_fit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceRoom {
    /// Free device memory now, as the runtime reports it.
    pub free: u64,
    /// What the allocator's memory limit (a GPU budget, `HIPDECODE_MEMORY_LIMIT`, or by default
    /// 90 % of a card) still allows: the limit less what it reserves. `None` without a limit.
    pub allocator_headroom: Option<u64>,
    /// The device's memory in all.
    pub total: u64,
    /// Whether some weights stay in host memory under the plan (the prefill's staging slots
    /// then take device memory).
    pub host_weights: bool,
}

impl DeviceRoom {
    /// Device memory left for the rest of the machine and what no layout lists (the runtime's
    /// pages for kernels first launched, a driver's growth): 2 % of the device, at least
    /// 256 MiB.
    pub fn reserve(&self) -> u64 {
        (self.total / 50).max(256 << 20)
    }
}

/// The headline of [`DeviceMemory`]: what the allocator holds from the device (reserved, of
/// it cached), its peak, and the bytes the process took outside it. One set of names for every
/// report that prints them (`--json-stats`, bench-decode's phases).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceNumbers {
    pub reserved: u64,
    pub peak_reserved: u64,
    pub cached: u64,
    /// Device bytes the process took since the backend was created.
    pub process_used: u64,
    /// `process_used` minus reserved: kernel modules, graphs, the runtime.
    pub outside_allocator: u64,
    /// [`DeviceMemory::per_process`], when it could be read.
    pub per_process: Option<u64>,
}

impl DeviceNumbers {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "reserved": self.reserved,
            "peak_reserved": self.peak_reserved,
            "cached": self.cached,
            "process_used": self.process_used,
            "outside_allocator": self.outside_allocator,
            "per_process": self.per_process,
        })
    }
}

impl From<&DeviceMemory> for DeviceNumbers {
    fn from(d: &DeviceMemory) -> DeviceNumbers {
        DeviceNumbers {
            reserved: d.stats.reserved_bytes,
            peak_reserved: d.stats.peak_reserved_bytes,
            cached: d.stats.cached_bytes,
            process_used: d.process_used,
            outside_allocator: d.outside_allocator,
            per_process: d.per_process.as_ref().ok().copied(),
        }
    }
}

impl DeviceMemory {
    /// Outside-the-allocator bytes that nothing above explains: `outside_allocator` minus the
    /// runtime's bytes at start and the graphs' measured bytes (0 when those exceed it).
    pub fn unattributed(&self) -> u64 {
        self.outside_allocator
            .saturating_sub(self.runtime_at_start)
            .saturating_sub(self.graph.measured_outside)
    }
}

/// The device memory of captured graphs: an estimate made from each graph's kernel nodes
/// before it was instantiated, and what the device lost around instantiation and the first
/// replay, outside the allocator. Both are sums over every capture so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphMemory {
    /// Graphs captured.
    pub captures: u64,
    /// Kernel nodes over every captured graph.
    pub kernel_nodes: u64,
    /// The estimate (see `backend::gpu::capture_stream::estimate_graph_bytes`).
    pub estimate: u64,
    /// Device bytes taken outside the allocator between the start of each capture and the
    /// end of its first replay (a coarse reading: the runtime reports free memory in pages).
    pub measured_outside: u64,
    /// Bytes the captures added to the allocator's graph pools.
    pub measured_pool: u64,
}

/// Formats bytes with a binary unit and one decimal, e.g. `241.3 MiB`: the reports' form of
/// rocm-alloc's formatter.
pub fn human_bytes(b: u64) -> String {
    rocm_alloc::fmt_bytes_decimals(b, 1)
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} memory: {} total (",
            self.location,
            human_bytes(self.total())
        )?;
        let shown = MemoryTag::ALL
            .into_iter()
            .filter(|t| ALWAYS_SHOWN.contains(t) || self.get(*t) > 0);
        for (i, tag) in shown.enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{} {}", tag.name(), human_bytes(self.get(tag)))?;
        }
        write!(f, ")")
    }
}

/// The host's available memory (`MemAvailable` of `/proc/meminfo`), in bytes; `None` where it
/// cannot be read.
pub fn host_available() -> Option<u64> {
    mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut parts = line.split_whitespace().skip(1);
    let kib: u64 = parts.next()?.parse().ok()?;
    (parts.next() == Some("kB")).then_some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_reads_the_kib_line() {
        let text = "MemTotal:  1000 kB\nMemFree: 10 kB\nMemAvailable:    2048 kB\n";
        assert_eq!(mem_available(text), Some(2048 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots\n"), None);
    }

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
