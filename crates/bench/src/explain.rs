//! Every byte the process holds on the device at a phase's end, explained: the allocator's
//! reserved bytes split into parts that do not overlap, then what lies outside it split into
//! the runtime's bytes at start, the captured graphs' bytes, and what is left: the
//! unattributed bytes, with their share of the phase's peak reserved. Also the graphs'
//! memory, estimated against measured, and the bytes stranded on streams other than the main
//! one.

use crate::table::{markdown, Column};
use decode::memory::{human_bytes, DeviceMemory, GraphMemory, MemoryTag};
use serde_json::{json, Value};

/// The device memory of one phase's end, in parts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Explained {
    /// Active bytes of the ordinary pools per tag, in [`MemoryTag::ALL`] order.
    pub active: [u64; MemoryTag::COUNT],
    /// Graph-pool segments (inside the allocator).
    pub graph_pools: u64,
    /// Idle segments of the ordinary pools: the cache a trim releases.
    pub cached: u64,
    /// Free space inside segments that also hold live blocks.
    pub fragmentation: u64,
    /// Blocks waiting for other streams' events.
    pub pending: u64,
    /// Of the active bytes, those of decode arenas.
    pub arena: u64,
    pub reserved: u64,
    pub peak_reserved: u64,
    pub process_used: u64,
    /// Outside the allocator when the backend had started (modules, streams, BLAS handle).
    pub runtime_at_start: u64,
    /// Outside the allocator, measured around each graph's instantiation and first replay.
    pub graph_outside: u64,
    /// Outside the allocator and explained by neither of the above.
    pub unattributed: u64,
    pub graph: GraphMemory,
    /// Stranded bytes per stream.
    pub stranded: Vec<(u64, u64)>,
    /// The process as nvidia-smi or rocm-smi list it, context included, when readable.
    pub per_process: Option<u64>,
}

impl Explained {
    pub fn from_device(d: &DeviceMemory) -> Explained {
        let b = &d.breakdown;
        let mut active = [0u64; MemoryTag::COUNT];
        for (tag, bytes) in &b.active_by_tag {
            active[tag.index()] = *bytes;
        }
        Explained {
            active,
            graph_pools: b.graph_pools,
            cached: b.releasable,
            fragmentation: b.fragmentation,
            pending: b.pending,
            arena: b.arena,
            reserved: d.stats.reserved_bytes,
            peak_reserved: d.stats.peak_reserved_bytes,
            process_used: d.process_used,
            runtime_at_start: d.runtime_at_start,
            graph_outside: d.graph.measured_outside,
            unattributed: d.unattributed(),
            graph: d.graph,
            stranded: d.stranded.clone(),
            per_process: d.per_process.as_ref().ok().copied(),
        }
    }

    /// What the process held before the backend's first reading (the runtime's context and
    /// whatever else came first): the per-process figure minus `process_used`.
    pub fn before_backend(&self) -> Option<u64> {
        self.per_process
            .map(|p| p.saturating_sub(self.process_used))
    }

    /// Unattributed bytes as a percentage of the phase's peak reserved bytes (0 when nothing
    /// was reserved).
    pub fn unattributed_pct(&self) -> f64 {
        if self.peak_reserved == 0 {
            0.0
        } else {
            100.0 * self.unattributed as f64 / self.peak_reserved as f64
        }
    }

    /// Bytes the parts add up to; equals `process_used` unless the runtime gave memory back
    /// after start (then the outside parts exceed what is outside now).
    pub fn total(&self) -> u64 {
        self.active.iter().sum::<u64>()
            + self.graph_pools
            + self.cached
            + self.fragmentation
            + self.pending
            + self.runtime_at_start
            + self.graph_outside
            + self.unattributed
    }

    pub fn to_json(&self) -> Value {
        let active: serde_json::Map<String, Value> = MemoryTag::ALL
            .into_iter()
            .map(|t| (t.name().to_string(), json!(self.active[t.index()])))
            .collect();
        json!({
            "active": active,
            "graph_pools": self.graph_pools,
            "cached": self.cached,
            "fragmentation": self.fragmentation,
            "pending": self.pending,
            "arena": self.arena,
            "reserved": self.reserved,
            "peak_reserved": self.peak_reserved,
            "process_used": self.process_used,
            "runtime_at_start": self.runtime_at_start,
            "graph_outside": self.graph_outside,
            "unattributed": self.unattributed,
            "unattributed_pct_of_peak_reserved": self.unattributed_pct(),
            "per_process": self.per_process,
            "before_backend": self.before_backend(),
            "graph": {
                "captures": self.graph.captures,
                "kernel_nodes": self.graph.kernel_nodes,
                "estimate": self.graph.estimate,
                "measured_outside": self.graph.measured_outside,
                "measured_pool": self.graph.measured_pool,
            },
            "stranded": self.stranded.iter().map(|(s, b)| json!({"stream": s, "bytes": b})).collect::<Vec<_>>(),
        })
    }
}

const SHOWN_TAGS: [MemoryTag; 4] = [
    MemoryTag::Weights,
    MemoryTag::KvCache,
    MemoryTag::Activations,
    MemoryTag::Workspace,
];

/// One row per model and phase that has device numbers: the parts, the process's total and
/// the unattributed share. Empty when no row has them.
pub fn explained_table(rows: &[(String, &Explained, &str)]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let per_process = rows.iter().any(|(_, e, _)| e.per_process.is_some());
    let mut columns = vec![Column::left("model"), Column::left("phase")];
    columns.extend(SHOWN_TAGS.iter().map(|t| Column::right(t.name())));
    for h in [
        "other tags",
        "graph",
        "cached",
        "arena",
        "frag slack",
        "pending",
        "runtime",
        "unattributed",
        "process used",
        "peak reserved",
        "unattr. / peak",
    ] {
        columns.push(Column::right(h));
    }
    if per_process {
        columns.push(Column::right("before backend"));
        columns.push(Column::right("per process (smi)"));
    }
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|(model, e, phase)| {
            let mut r = vec![model.clone(), phase.to_string()];
            r.extend(SHOWN_TAGS.iter().map(|t| human_bytes(e.active[t.index()])));
            let other: u64 = MemoryTag::ALL
                .iter()
                .filter(|t| !SHOWN_TAGS.contains(t))
                .map(|t| e.active[t.index()])
                .sum();
            r.extend([
                human_bytes(other),
                human_bytes(e.graph_pools + e.graph_outside),
                human_bytes(e.cached),
                human_bytes(e.arena),
                human_bytes(e.fragmentation),
                human_bytes(e.pending),
                human_bytes(e.runtime_at_start),
                human_bytes(e.unattributed),
                human_bytes(e.process_used),
                human_bytes(e.peak_reserved),
                format!("{:.2} %", e.unattributed_pct()),
            ]);
            if per_process {
                let hb = |v: Option<u64>| v.map(human_bytes).unwrap_or_else(|| "-".into());
                r.push(hb(e.before_backend()));
                r.push(hb(e.per_process));
            }
            r
        })
        .collect();
    let mut out = markdown(&columns, &body);
    out.push_str(
        "\nEvery device byte at the phase's end. Tag columns: active blocks of the ordinary \
         pools. graph: the graph pools plus what the device lost outside the allocator around \
         each graph's instantiation and first replay. cached: idle segments a trim can \
         release. arena: decode arenas (already inside their tag's column). frag slack: free \
         space inside segments that still hold a live block, which no trim releases. pending: \
         frees waiting for another stream. runtime: outside the allocator when the backend had \
         started (kernel modules, streams, the BLAS handle). unattributed: process used minus \
         all of the above; unattr. / peak is its share of the phase's peak reserved.\n",
    );
    if per_process {
        out.push_str(
            "per process (smi): the process's device memory as nvidia-smi (NVML) or rocm-smi \
             (amdkfd) list it, the figure runtimes are compared by; before backend: its part \
             that predates the backend's first reading, the runtime's context above all, \
             which process used cannot see.\n",
        );
    }
    out
}

/// Per model: the graphs captured, their kernel nodes, the estimate and the measured bytes.
pub fn graph_table(rows: &[(String, GraphMemory)]) -> String {
    let columns = [
        Column::left("model"),
        Column::right("graphs"),
        Column::right("kernel nodes"),
        Column::right("estimate"),
        Column::right("measured outside"),
        Column::right("measured pool"),
        Column::right("measured / estimate"),
    ];
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|(model, g)| {
            let measured = g.measured_outside + g.measured_pool;
            let ratio = if g.estimate == 0 {
                "-".to_string()
            } else {
                format!("{:.2}", measured as f64 / g.estimate as f64)
            };
            vec![
                model.clone(),
                g.captures.to_string(),
                g.kernel_nodes.to_string(),
                human_bytes(g.estimate),
                human_bytes(g.measured_outside),
                human_bytes(g.measured_pool),
                ratio,
            ]
        })
        .collect();
    let mut out = markdown(&columns, &body);
    out.push_str(
        "\nGraph memory: the estimate is made before instantiation from the kernel nodes the \
         capture recorded, at an assumed 4 KiB per node rounded up to the runtime's 2 MiB \
         pages (a rough model, not a driver figure; the expected pool bytes are 0, since the \
         step's buffers are reserved at load). Measured: device free memory lost outside the \
         allocator from the capture's start to the end of the first replay (read in pages; it \
         also holds anything else the runtime took meanwhile, such as code loaded at a \
         kernel's first launch), and the allocator's graph-pool growth.\n",
    );
    out
}

/// `stranded: 2.0 MiB on stream 7` lines, one per model and stream; empty when none.
pub fn stranded_lines(rows: &[(String, &Explained)]) -> String {
    let mut out = String::new();
    for (model, e) in rows {
        for (stream, bytes) in &e.stranded {
            out.push_str(&format!(
                "stranded {model}: {} on stream {stream} (cached where the main stream cannot reuse it)\n",
                human_bytes(*bytes)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Explained {
        let mut e = Explained {
            graph_pools: 0,
            cached: 2 << 20,
            fragmentation: 1 << 20,
            reserved: 103 << 20,
            peak_reserved: 200 << 20,
            process_used: 115 << 20,
            runtime_at_start: 6 << 20,
            graph_outside: 2 << 20,
            unattributed: 4 << 20,
            graph: GraphMemory {
                captures: 1,
                kernel_nodes: 300,
                estimate: 2 << 20,
                measured_outside: 2 << 20,
                measured_pool: 0,
            },
            stranded: vec![(7, 3 << 20)],
            ..Explained::default()
        };
        e.active[MemoryTag::Weights.index()] = 100 << 20;
        e
    }

    #[test]
    fn the_parts_add_up_and_the_share_is_of_peak_reserved() {
        let e = sample();
        assert_eq!(e.total(), e.process_used);
        assert!((e.unattributed_pct() - 2.0).abs() < 1e-9);
        let t = explained_table(&[("m".into(), &e, "decode")]);
        assert!(t.contains("2.00 %") && t.contains("100.0 MiB"), "{t}");
        assert!(
            t.contains("frag slack") && t.contains("unattributed"),
            "{t}"
        );
        let j = e.to_json();
        assert_eq!(j["active"]["weights"], 100u64 << 20);
        assert_eq!(j["graph"]["kernel_nodes"], 300);
        assert_eq!(j["stranded"][0]["stream"], 7);
        let s = stranded_lines(&[("m".into(), &e)]);
        assert!(s.contains("3.0 MiB on stream 7"), "{s}");
        let g = graph_table(&[("m".into(), e.graph)]);
        assert!(g.contains("1.00 |") && g.contains("300"), "{g}");
    }

    /// The per-process figure (nvidia-smi's or rocm-smi's) minus process used is what came
    /// before the backend; both columns show only when a row has the figure.
    #[test]
    fn the_per_process_figure_splits_off_what_came_before_the_backend() {
        let mut e = sample();
        let t = explained_table(&[("m".into(), &e, "decode")]);
        assert!(!t.contains("before backend"), "{t}");
        assert_eq!(e.to_json()["before_backend"], Value::Null);
        e.per_process = Some(e.process_used + (500 << 20));
        assert_eq!(e.before_backend(), Some(500 << 20));
        let t = explained_table(&[("m".into(), &e, "decode")]);
        assert!(
            t.contains("before backend") && t.contains("500.0 MiB"),
            "{t}"
        );
        assert_eq!(e.to_json()["before_backend"], 500u64 << 20);
    }
}
