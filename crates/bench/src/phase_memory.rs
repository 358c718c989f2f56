//! Memory per benchmark phase (load, prefill, decode): bytes per tag with their peaks, the
//! allocator's reserved and cached bytes and the device memory outside it on a device; the
//! process's resident memory everywhere.

use crate::explain::Explained;
use crate::table::{markdown, Column};
use decode::memory::{human_bytes, DeviceMemory, DeviceNumbers, MemoryReport, MemoryTag};
use serde_json::{json, Value};

/// A stretch of the benchmark whose memory is reported on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// `Session::load`: weights (`Model::load`), then the KV cache and activation buffers
    /// (`Context::new`).
    Load,
    /// Every pp run (warm-up included).
    Prefill,
    /// Every tg run (warm-up included).
    Decode,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Load => "load",
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
        }
    }
}

/// What a peak covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// The phase alone: the counter was reset when it began.
    Phase,
    /// The process's lifetime (the peak RSS where `/proc/self/clear_refs` cannot reset it).
    Process,
}

impl Window {
    pub fn name(self) -> &'static str {
        match self {
            Window::Phase => "phase",
            Window::Process => "process",
        }
    }
}

/// Current and peak bytes of one tag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TagBytes {
    pub current: u64,
    pub peak: u64,
}

/// The memory of one phase, read when it ended.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseMemory {
    pub phase: Phase,
    /// "host" or the device's name.
    pub location: String,
    /// Per tag, in [`MemoryTag::ALL`] order.
    pub tags: [TagBytes; MemoryTag::COUNT],
    /// What the tag peaks and `peak_reserved` cover.
    pub peak_window: Window,
    /// `None` on the CPU backend.
    pub device: Option<DeviceNumbers>,
    pub rss: Option<u64>,
    pub peak_rss: Option<u64>,
    pub rss_window: Window,
    /// Every device byte at the phase's end, in parts (`None` on the CPU backend).
    pub explained: Option<Explained>,
}

impl PhaseMemory {
    /// From a device backend's counters.
    pub fn from_device(
        phase: Phase,
        location: &str,
        peak_window: Window,
        d: &DeviceMemory,
    ) -> PhaseMemory {
        let mut tags = [TagBytes::default(); MemoryTag::COUNT];
        for (tag, usage) in &d.stats.per_tag {
            tags[tag.index()] = TagBytes {
                current: usage.current,
                peak: usage.peak,
            };
        }
        PhaseMemory {
            phase,
            location: location.to_string(),
            tags,
            peak_window,
            device: Some(DeviceNumbers::from(d)),
            rss: None,
            peak_rss: None,
            rss_window: Window::Process,
            explained: Some(Explained::from_device(d)),
        }
    }

    /// From a host backend's books: `now` at the phase's end and `seen_max`, the most each tag
    /// held at the moments the bench looked during the phase (host buffers have no peak
    /// counter; the CPU backend allocates everything at load, so the two agree).
    pub fn from_host(
        phase: Phase,
        now: &MemoryReport,
        seen_max: &[u64; MemoryTag::COUNT],
    ) -> PhaseMemory {
        let mut tags = [TagBytes::default(); MemoryTag::COUNT];
        for (i, t) in tags.iter_mut().enumerate() {
            t.current = now.bytes[i];
            t.peak = now.bytes[i].max(seen_max[i]);
        }
        PhaseMemory {
            phase,
            location: now.location.clone(),
            tags,
            peak_window: Window::Phase,
            device: None,
            rss: None,
            peak_rss: None,
            rss_window: Window::Process,
            explained: None,
        }
    }

    pub fn tag(&self, tag: MemoryTag) -> TagBytes {
        self.tags[tag.index()]
    }

    /// The numbers as JSON (bytes throughout).
    pub fn to_json(&self) -> Value {
        let tags: serde_json::Map<String, Value> = MemoryTag::ALL
            .into_iter()
            .map(|t| {
                let b = self.tag(t);
                (
                    t.name().to_string(),
                    json!({"current": b.current, "peak": b.peak}),
                )
            })
            .collect();
        json!({
            "phase": self.phase.name(),
            "location": self.location,
            "peak_window": self.peak_window.name(),
            "tags": tags,
            "device": self.device.as_ref().map(DeviceNumbers::to_json),
            "rss": self.rss,
            "peak_rss": self.peak_rss,
            "rss_window": self.rss_window.name(),
            "explained": self.explained.as_ref().map(Explained::to_json),
        })
    }

    /// CSV column names for one phase, each prefixed.
    pub fn csv_headers(prefix: &str) -> Vec<String> {
        let mut h: Vec<String> = MemoryTag::ALL
            .iter()
            .map(|t| format!("{prefix}{}_peak", t.name()))
            .collect();
        for name in [
            "reserved",
            "peak_reserved",
            "cached",
            "process_used",
            "outside_allocator",
            "per_process",
            "rss",
            "peak_rss",
            "peak_window",
            "rss_window",
        ] {
            h.push(format!("{prefix}{name}"));
        }
        h
    }

    /// CSV cells matching [`PhaseMemory::csv_headers`]; unknown numbers are empty.
    pub fn csv_cells(&self) -> Vec<String> {
        let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
        let mut c: Vec<String> = self.tags.iter().map(|t| t.peak.to_string()).collect();
        let d = self.device;
        c.push(opt(d.map(|d| d.reserved)));
        c.push(opt(d.map(|d| d.peak_reserved)));
        c.push(opt(d.map(|d| d.cached)));
        c.push(opt(d.map(|d| d.process_used)));
        c.push(opt(d.map(|d| d.outside_allocator)));
        c.push(opt(d.and_then(|d| d.per_process)));
        c.push(opt(self.rss));
        c.push(opt(self.peak_rss));
        c.push(self.peak_window.name().to_string());
        c.push(self.rss_window.name().to_string());
        c
    }
}

/// The tags the memory table always shows, as decode's own report does.
const MAIN_TAGS: [MemoryTag; 4] = [
    MemoryTag::Weights,
    MemoryTag::KvCache,
    MemoryTag::Activations,
    MemoryTag::Workspace,
];

/// The Markdown memory table: one row per model and phase. Tag columns hold each tag's peak;
/// the four main tags always show, the others when some row has bytes under them; device and
/// RSS columns show when some row has them.
pub fn memory_table(rows: &[(String, PhaseMemory)]) -> String {
    let tags: Vec<MemoryTag> = MemoryTag::ALL
        .into_iter()
        .filter(|&t| MAIN_TAGS.contains(&t) || rows.iter().any(|(_, m)| m.tag(t).peak > 0))
        .collect();
    let any_device = rows.iter().any(|(_, m)| m.device.is_some());
    let any_per_process = rows
        .iter()
        .any(|(_, m)| m.device.is_some_and(|d| d.per_process.is_some()));
    let any_rss = rows.iter().any(|(_, m)| m.rss.is_some());
    let mut columns = vec![Column::left("model"), Column::left("phase")];
    columns.extend(tags.iter().map(|t| Column::right(t.name())));
    if any_device {
        for h in [
            "reserved",
            "peak reserved",
            "cached",
            "process used",
            "outside alloc",
        ] {
            columns.push(Column::right(h));
        }
    }
    if any_per_process {
        columns.push(Column::right("per process (smi)"));
    }
    if any_rss {
        columns.push(Column::right("rss"));
        columns.push(Column::right("peak rss"));
    }
    columns.push(Column::left("peaks over"));
    let hb = |v: Option<u64>| v.map(human_bytes).unwrap_or_else(|| "-".to_string());
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|(model, m)| {
            let mut r = vec![model.clone(), m.phase.name().to_string()];
            r.extend(tags.iter().map(|&t| human_bytes(m.tag(t).peak)));
            if any_device {
                let d = m.device;
                r.push(hb(d.map(|d| d.reserved)));
                r.push(hb(d.map(|d| d.peak_reserved)));
                r.push(hb(d.map(|d| d.cached)));
                r.push(hb(d.map(|d| d.process_used)));
                r.push(hb(d.map(|d| d.outside_allocator)));
            }
            if any_per_process {
                r.push(hb(m.device.and_then(|d| d.per_process)));
            }
            if any_rss {
                r.push(hb(m.rss));
                r.push(hb(m.peak_rss));
            }
            let window = if any_rss && m.rss_window != m.peak_window {
                format!("{} (rss: {})", m.peak_window.name(), m.rss_window.name())
            } else {
                m.peak_window.name().to_string()
            };
            r.push(window);
            r
        })
        .collect();
    markdown(&columns, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn host_phase(phase: Phase, weights: u64, kv: u64) -> PhaseMemory {
        let mut now = MemoryReport {
            location: "host".into(),
            ..MemoryReport::default()
        };
        now.add(MemoryTag::Weights, weights);
        now.add(MemoryTag::KvCache, kv);
        let mut m = PhaseMemory::from_host(phase, &now, &[0; MemoryTag::COUNT]);
        m.rss = Some(10 << 20);
        m.peak_rss = Some(12 << 20);
        m.rss_window = Window::Phase;
        m
    }

    #[test]
    fn host_peaks_take_the_largest_seen() {
        let mut now = MemoryReport::default();
        now.add(MemoryTag::Activations, 100);
        let mut seen = [0; MemoryTag::COUNT];
        seen[MemoryTag::Activations.index()] = 300;
        seen[MemoryTag::Workspace.index()] = 7;
        let m = PhaseMemory::from_host(Phase::Prefill, &now, &seen);
        assert_eq!(
            m.tag(MemoryTag::Activations),
            TagBytes {
                current: 100,
                peak: 300
            }
        );
        assert_eq!(m.tag(MemoryTag::Workspace).peak, 7);
        assert!(m.device.is_none());
    }

    #[test]
    fn host_table_shows_main_tags_and_rss_but_no_device_columns() {
        let rows = vec![
            (
                "tiny.gguf".to_string(),
                host_phase(Phase::Load, 3 << 20, 512),
            ),
            (
                "tiny.gguf".to_string(),
                host_phase(Phase::Decode, 3 << 20, 512),
            ),
        ];
        let t = memory_table(&rows);
        let header = t.lines().next().unwrap();
        for h in [
            "weights",
            "kv_cache",
            "activations",
            "workspace",
            "peak rss",
        ] {
            assert!(header.contains(h), "{header}");
        }
        assert!(!header.contains("reserved"), "{header}");
        assert!(!header.contains("graph"), "{header}");
        assert!(t.contains("3.0 MiB") && t.contains("512 B"), "{t}");
        assert_eq!(t.lines().count(), 4, "{t}");
    }

    #[test]
    fn device_rows_add_allocator_columns_and_json_has_every_tag() {
        let mut m = host_phase(Phase::Prefill, 1 << 30, 0);
        m.device = Some(DeviceNumbers {
            reserved: 2 << 30,
            peak_reserved: 3 << 30,
            cached: 1 << 30,
            process_used: 5 << 30,
            outside_allocator: 3 << 30,
            per_process: None,
        });
        m.peak_window = Window::Process;
        m.tags[MemoryTag::Graph.index()].peak = 4096;
        let t = memory_table(&[("m".into(), m.clone())]);
        assert!(t.contains("peak reserved") && t.contains("3.0 GiB"), "{t}");
        assert!(t.contains("graph") && t.contains("4.0 KiB"), "{t}");
        assert!(t.contains("process (rss: phase)"), "{t}");
        let j = m.to_json();
        assert_eq!(j["device"]["outside_allocator"], 3u64 << 30);
        assert_eq!(j["tags"]["weights"]["peak"], 1u64 << 30);
        assert_eq!(j["tags"].as_object().unwrap().len(), MemoryTag::COUNT);
        assert_eq!(j["peak_window"], "process");
        assert_eq!(PhaseMemory::csv_headers("x_").len(), m.csv_cells().len());
        assert!(!t.contains("per process"), "no row has the figure: {t}");
        assert_eq!(j["device"]["per_process"], Value::Null);
    }

    /// The per-process column (what nvidia-smi or rocm-smi list) shows when a row has it, and
    /// a row without it shows "-".
    #[test]
    fn the_per_process_column_shows_when_a_row_has_the_figure() {
        let numbers = |per_process| DeviceNumbers {
            reserved: 2 << 30,
            peak_reserved: 2 << 30,
            cached: 0,
            process_used: 2 << 30,
            outside_allocator: 0,
            per_process,
        };
        let mut with = host_phase(Phase::Load, 1 << 30, 0);
        with.device = Some(numbers(Some(2560 << 20)));
        let mut without = host_phase(Phase::Decode, 1 << 30, 0);
        without.device = Some(numbers(None));
        let t = memory_table(&[("a".into(), with.clone()), ("b".into(), without)]);
        let header = t.lines().next().unwrap();
        assert!(header.contains("per process (smi)"), "{t}");
        let cell = |row: &str| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let at = header
                .split('|')
                .map(str::trim)
                .position(|h| h == "per process (smi)")
                .unwrap();
            cells[at].to_string()
        };
        let rows: Vec<&str> = t.lines().skip(2).collect();
        assert_eq!(cell(rows[0]), "2.5 GiB", "{t}");
        assert_eq!(cell(rows[1]), "-", "{t}");
        assert_eq!(with.to_json()["device"]["per_process"], 2560u64 << 20);
    }
}
