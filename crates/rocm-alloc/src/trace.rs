//! Allocation traces: the allocator's optional bounded ring of events, and the versioned text
//! file that carries a run's trace to another machine's memory ([`crate::replay`]).
//!
//! The ring is off by default; when off, the allocator checks one `Option` and records
//! nothing. When on, it records every user allocation, free and `record_stream`, every device
//! call, and the limit and weight reports made through the API, each with a nanosecond
//! timestamp. Allocations get an id, so that a free names its allocation even when the address
//! is reused.
//!
//! # The file format (version 1)
//!
//! JSON lines: one header object on line 1, then one event object per line, in the order the
//! allocator saw them (timestamps never decrease). `docs/memory.md` ("Replaying a trace on
//! another machine's memory") shows an example.
//!
//! The header ([`TraceHeader`]) names the format (`"format": "hipdecode-alloc-trace"`) and its
//! `version`, the device the trace was recorded on (name, memory, UMA layout), the allocator
//! configuration in force when tracing began (limits, whether the cache limit was explicit,
//! weight bytes, the trim window), the number of events that follow, and whether the trace is
//! complete: events dropped by a full ring, events taken out earlier by
//! [`crate::Allocator::take_trace`], and frees whose allocation the trace never saw all make it
//! incomplete, and replay refuses such a trace.
//!
//! Events ([`TraceRecord`]), told apart by `"ev"`; `t` is nanoseconds since tracing began and
//! `stream` the allocator's stream number (`0` = the null stream):
//!
//! | `ev` | fields | meaning |
//! | --- | --- | --- |
//! | `alloc` | `t id size block? tag stream` | a user allocation of `size` requested bytes (`block`: what the recording allocator set aside) |
//! | `free` | `t id size tag stream` | that allocation freed; `size`, `tag` and `stream` repeat the allocation's |
//! | `use` | `t id stream` | `record_stream`: `stream` also uses the allocation |
//! | `device_alloc`, `device_free` | `t size` | the recording allocator's device calls (not replayed) |
//! | `weights` | `t bytes` | the runtime reported its weight bytes (`set_weight_bytes`) |
//! | `memory_limit`, `cache_limit` | `t bytes` | a limit set through the API (`null` = unbounded) |
//! | `repeat` | `t lines times` | generated traces only: the `lines` lines before happen `times` more times |
//!
//! An `id` names one live allocation: the recorder never reuses one, and a generated trace may
//! reuse an id once its allocation is freed (a repeated block does), never while it is live.
//!
//! Reading checks every line and stops at the first problem with an error naming the line:
//! a garbled line, an unknown event, a version this build does not read, a time that goes
//! back, an id allocated while live, a free or use without its allocation, a free that
//! disagrees with its allocation, a repeat that does not fit, or a file that ends before the
//! header's event count.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::device::{StreamId, UmaInfo};
use crate::tag::Tag;

/// The `format` value of a trace file's header.
pub const TRACE_FORMAT: &str = "hipdecode-alloc-trace";
/// The file format version this build writes and reads.
pub const TRACE_VERSION: u32 = 1;

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
    /// Another stream was recorded as using an allocation (`record_stream`); the event's
    /// `stream` is that other stream.
    StreamUse,
    /// The runtime reported its weight bytes (`set_weight_bytes`); `size` holds them.
    WeightBytes,
    /// The memory limit was set through the API (`None` = unbounded).
    MemoryLimit(Option<u64>),
    /// The cache limit was set through the API (`None` = unbounded).
    CacheLimit(Option<u64>),
}

/// One recorded event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TraceEvent {
    /// Nanoseconds since tracing was enabled.
    pub t_ns: u64,
    /// What happened.
    pub kind: TraceKind,
    /// Device address (0 for weight and limit reports).
    pub addr: u64,
    /// Bytes: the block size for user events, the segment size for device events, the weight
    /// bytes for [`TraceKind::WeightBytes`]; 0 otherwise.
    pub size: u64,
    /// Tag of the allocation (`other` for the other events).
    pub tag: Tag,
    /// Stream of the allocation (for [`TraceKind::StreamUse`], the stream that uses it).
    pub stream: StreamId,
    /// Id of the allocation (alloc, free and stream-use events; 0 otherwise), unique within
    /// the trace, so a free names its allocation even when addresses are reused.
    pub id: u64,
    /// Bytes the caller asked for (alloc and free events; 0 otherwise). Allocations already
    /// live when tracing began are recorded with their block size here.
    pub requested: u64,
}

/// The allocator's configuration when tracing began, as a trace file carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceConfig {
    /// The memory limit in bytes (`None` = unbounded).
    pub memory_limit: Option<u64>,
    /// The cache limit in bytes (`None` = unbounded).
    pub cache_limit: Option<u64>,
    /// Whether the cache limit was set explicitly (API or environment) rather than being the
    /// default.
    pub cache_limit_explicit: bool,
    /// Weight bytes the allocator had been told of.
    pub weight_bytes: u64,
    /// [`crate::AllocatorConfig::trim_hot_window`].
    pub trim_hot_window: u64,
}

/// The UMA layout of the recording device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceUma {
    /// Carve-out bytes.
    pub carve_out: u64,
    /// GTT bytes.
    pub gtt: u64,
    /// Host RAM bytes visible to the OS.
    pub host_ram: u64,
}

impl From<UmaInfo> for TraceUma {
    fn from(u: UmaInfo) -> Self {
        TraceUma {
            carve_out: u.carve_out,
            gtt: u.gtt,
            host_ram: u.host_ram,
        }
    }
}

/// The device a trace was recorded on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceDevice {
    /// The backend's name for it.
    pub name: String,
    /// Total bytes the device reported (on UMA devices, the carve-out).
    pub total: u64,
    /// Bytes the GPU can use: the total on discrete cards, carve-out plus GTT on UMA devices.
    pub usable: u64,
    /// The UMA layout, on integrated devices.
    pub uma: Option<TraceUma>,
}

/// The recording allocator's counters when the file was written, for comparing a replay with
/// the run it came from. Peaks count since the last `reset_peak`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordedCounters {
    /// Bytes reserved from the device when written.
    pub reserved_bytes: u64,
    /// Bytes active when written.
    pub active_bytes: u64,
    /// Peak reserved bytes (since the last `reset_peak`).
    pub peak_reserved_bytes: u64,
    /// Peak active bytes (since the last `reset_peak`).
    pub peak_active_bytes: u64,
    /// Device allocations made.
    pub device_allocs: u64,
    /// Device frees made.
    pub device_frees: u64,
}

/// Line 1 of a trace file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceHeader {
    /// Always [`TRACE_FORMAT`].
    pub format: String,
    /// [`TRACE_VERSION`] when written by this build.
    pub version: u32,
    /// Where it was recorded.
    pub device: TraceDevice,
    /// The allocator's configuration when tracing began.
    pub config: TraceConfig,
    /// Number of event lines that follow.
    pub events: u64,
    /// True when the events are every event since tracing began: nothing dropped, nothing
    /// taken out earlier, no free of an allocation the trace did not see.
    pub complete: bool,
    /// Events lost because the ring was full.
    pub dropped_events: u64,
    /// Events handed out earlier by `take_trace` (and so not in this file).
    pub taken_events: u64,
    /// Frees of allocations the trace never saw.
    pub unmatched_frees: u64,
    /// The ring's capacity in events (`None` for traces not recorded through the ring).
    pub ring_capacity: Option<u64>,
    /// Allocations already live when tracing began; they are the first alloc events, at
    /// `t = 0`, with their block size as the requested size.
    pub live_at_start: u64,
    /// Allocations served from graph-capture pools. The trace does not record captures, so a
    /// replay serves these from the ordinary pools.
    pub graph_pool_allocs: u64,
    /// The recording allocator's counters when the file was written.
    pub recorded: Option<RecordedCounters>,
    /// How the trace was made, for people reading it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl TraceHeader {
    /// Why the trace is incomplete, with what to do about it; `None` when it is complete.
    pub fn incompleteness(&self) -> Option<String> {
        let mut why = Vec::new();
        if self.dropped_events > 0 {
            let cap = self
                .ring_capacity
                .map_or(String::new(), |c| format!(" of {c} events"));
            why.push(format!(
                "{} events were dropped because the trace ring{cap} was full; record again with \
                 a capacity of at least {} events (bench-decode --alloc-trace-capacity N, \
                 AllocatorConfig::trace_capacity or Allocator::enable_trace(N))",
                self.dropped_events,
                (self.events + self.dropped_events).next_power_of_two()
            ));
        }
        if self.taken_events > 0 {
            why.push(format!(
                "{} events were taken out earlier with Allocator::take_trace; write the file \
                 without calling take_trace first",
                self.taken_events
            ));
        }
        if self.unmatched_frees > 0 {
            why.push(format!(
                "{} frees are of allocations the trace never saw",
                self.unmatched_frees
            ));
        }
        if why.is_empty() && !self.complete {
            why.push("the header marks it incomplete".to_string());
        }
        (!why.is_empty()).then(|| why.join("; "))
    }
}

/// One event line of a trace file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case", deny_unknown_fields)]
pub enum TraceRecord {
    /// A user allocation.
    Alloc {
        /// Nanoseconds since tracing began.
        t: u64,
        /// Allocation id: not live already (see the module docs).
        id: u64,
        /// Bytes requested.
        size: u64,
        /// Bytes the recording allocator set aside (absent in synthetic traces).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        block: Option<u64>,
        /// Accounting tag.
        #[serde(with = "tag_name")]
        tag: Tag,
        /// Stream number (0 = the null stream).
        stream: u64,
    },
    /// A user free; `size`, `tag` and `stream` repeat the allocation's.
    Free {
        /// Nanoseconds since tracing began.
        t: u64,
        /// Id of the allocation freed.
        id: u64,
        /// Bytes requested by the allocation.
        size: u64,
        /// The allocation's tag.
        #[serde(with = "tag_name")]
        tag: Tag,
        /// The allocation's stream.
        stream: u64,
    },
    /// `record_stream`: `stream` also uses allocation `id`.
    Use {
        /// Nanoseconds since tracing began.
        t: u64,
        /// Id of the allocation.
        id: u64,
        /// The other stream.
        stream: u64,
    },
    /// The recording allocator obtained a segment (informational; not replayed).
    DeviceAlloc {
        /// Nanoseconds since tracing began.
        t: u64,
        /// Segment bytes.
        size: u64,
    },
    /// The recording allocator returned a segment (informational; not replayed).
    DeviceFree {
        /// Nanoseconds since tracing began.
        t: u64,
        /// Segment bytes.
        size: u64,
    },
    /// The runtime reported its weight bytes.
    Weights {
        /// Nanoseconds since tracing began.
        t: u64,
        /// Weight bytes.
        bytes: u64,
    },
    /// The memory limit was set through the API.
    MemoryLimit {
        /// Nanoseconds since tracing began.
        t: u64,
        /// The limit in bytes (`null` = unbounded).
        bytes: Option<u64>,
    },
    /// The cache limit was set through the API.
    CacheLimit {
        /// Nanoseconds since tracing began.
        t: u64,
        /// The limit in bytes (`null` = unbounded).
        bytes: Option<u64>,
    },
    /// For generated traces (the recorder never writes it): the `lines` lines just before
    /// this one happen `times` more times, repetition `r` shifted by `r × (t − t0)`, where `t0`
    /// is the time of the block's first line. Allocation ids repeat as written, so a repeated
    /// block must free what it allocates. Blocks may nest but not partly overlap.
    Repeat {
        /// When the first repetition begins.
        t: u64,
        /// How many lines before this one form the block.
        lines: u64,
        /// How many more times the block happens.
        times: u64,
    },
}

impl TraceRecord {
    /// The event's time.
    pub fn t(&self) -> u64 {
        match *self {
            TraceRecord::Alloc { t, .. }
            | TraceRecord::Free { t, .. }
            | TraceRecord::Use { t, .. }
            | TraceRecord::DeviceAlloc { t, .. }
            | TraceRecord::DeviceFree { t, .. }
            | TraceRecord::Weights { t, .. }
            | TraceRecord::MemoryLimit { t, .. }
            | TraceRecord::CacheLimit { t, .. }
            | TraceRecord::Repeat { t, .. } => t,
        }
    }

    /// The same event `by` nanoseconds later (`None` if the time overflows).
    fn shifted(mut self, by: u64) -> Option<TraceRecord> {
        let t = match &mut self {
            TraceRecord::Alloc { t, .. }
            | TraceRecord::Free { t, .. }
            | TraceRecord::Use { t, .. }
            | TraceRecord::DeviceAlloc { t, .. }
            | TraceRecord::DeviceFree { t, .. }
            | TraceRecord::Weights { t, .. }
            | TraceRecord::MemoryLimit { t, .. }
            | TraceRecord::CacheLimit { t, .. }
            | TraceRecord::Repeat { t, .. } => t,
        };
        *t = t.checked_add(by)?;
        Some(self)
    }
}

/// Where an event of a trace comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventAt {
    /// Position among the events as they happen (repeats expanded), from 0.
    pub index: u64,
    /// The file line that states it (the header is line 1).
    pub line: u64,
    /// When a `repeat` line produced it: that line and which repetition (from 1).
    pub repeat: Option<(u64, u64)>,
}

impl std::fmt::Display for EventAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}", self.line)?;
        if let Some((line, r)) = self.repeat {
            write!(f, " (repetition {r} of the block repeated by line {line})")?;
        }
        Ok(())
    }
}

/// The most events a trace may expand to through `repeat` lines (about 4 billion): more would
/// take hours to replay and is most likely a mistake in a generator.
pub const MAX_EXPANDED_EVENTS: u64 = 1 << 32;

/// Tags by their snake_case names, as the statistics and snapshots write them.
mod tag_name {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    use crate::tag::Tag;

    pub fn serialize<S: Serializer>(tag: &Tag, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(tag.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Tag, D::Error> {
        let name = String::deserialize(d)?;
        Tag::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| {
                let known: Vec<&str> = Tag::ALL.iter().map(|t| t.name()).collect();
                D::Error::custom(format!(
                    "unknown tag {name:?} (known: {})",
                    known.join(", ")
                ))
            })
    }
}

/// Why a trace could not be read, written or replayed. Reading errors name the line (line 1 is
/// the header).
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be opened, read or written.
    #[error("{}: {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// Reading or writing failed (for a file given by path, see [`TraceError::File`]).
    #[error("line {line}: {source}")]
    Io {
        /// The line being read or written.
        line: u64,
        /// What failed.
        source: std::io::Error,
    },
    /// Nothing to read.
    #[error(
        "the trace is empty: a trace file starts with a header line \
         ({{\"format\":\"{TRACE_FORMAT}\",...}})"
    )]
    Empty,
    /// Line 1 is not a trace header.
    #[error(
        "line 1 is not a hipdecode allocation trace header ({problem}); a trace file starts with \
         {{\"format\":\"{TRACE_FORMAT}\",\"version\":{TRACE_VERSION},...}}"
    )]
    NotATrace {
        /// What is wrong.
        problem: String,
    },
    /// A version this build does not read.
    #[error(
        "line 1: trace format version {found} is not supported (this build reads version \
         {TRACE_VERSION}); record the trace again with this build, or replay it with the build \
         that wrote it"
    )]
    UnsupportedVersion {
        /// The version in the file.
        found: u64,
    },
    /// The header is inconsistent.
    #[error("line 1: bad header: {problem}")]
    BadHeader {
        /// What is wrong.
        problem: String,
    },
    /// A line that is not a valid event.
    #[error("line {line}: not a trace event ({problem}); events look like {{\"ev\":\"alloc\",\"t\":0,\"id\":1,\"size\":4096,\"tag\":\"weights\",\"stream\":0}}")]
    Garbled {
        /// The line.
        line: u64,
        /// What the parser said.
        problem: String,
    },
    /// Timestamps must not decrease.
    #[error("line {line}: time {t} ns is before the previous event's {previous} ns; events must be in the order they happened")]
    TimeGoesBack {
        /// The line.
        line: u64,
        /// Its time.
        t: u64,
        /// The previous event's time.
        previous: u64,
    },
    /// An allocation of zero bytes.
    #[error(
        "line {line}: allocation {id} requests 0 bytes; the allocator refuses zero-byte requests"
    )]
    ZeroSize {
        /// The line.
        line: u64,
        /// The allocation id.
        id: u64,
    },
    /// An id allocated while still live.
    #[error("line {line}: allocation id {id} is already live (allocated on line {first_line} and not freed since)")]
    DuplicateId {
        /// The line.
        line: u64,
        /// The id.
        id: u64,
        /// Where it was allocated.
        first_line: u64,
    },
    /// A free or use of an id that is not live.
    #[error("line {line}: {what} of allocation {id}, which is not live (never allocated, or already freed)")]
    WithoutAlloc {
        /// The line.
        line: u64,
        /// "free" or "use".
        what: &'static str,
        /// The id.
        id: u64,
    },
    /// A free whose size, tag or stream differs from its allocation's.
    #[error("line {line}: the free of allocation {id} gives {field} {found}, but its allocation on line {alloc_line} has {expected}")]
    Mismatch {
        /// The line.
        line: u64,
        /// The id.
        id: u64,
        /// "size", "tag" or "stream".
        field: &'static str,
        /// The free's value.
        found: String,
        /// The allocation's value.
        expected: String,
        /// Where it was allocated.
        alloc_line: u64,
    },
    /// Fewer or more events than the header announces.
    #[error("the header announces {expected} events but the file has {found}: {hint}")]
    CountMismatch {
        /// The header's count.
        expected: u64,
        /// Events present.
        found: u64,
        /// What it likely means.
        hint: &'static str,
    },
    /// A `repeat` line that cannot be expanded.
    #[error("line {line}: bad repeat: {problem}")]
    BadRepeat {
        /// The repeat line.
        line: u64,
        /// What is wrong.
        problem: String,
    },
    /// A problem found in an event produced by a `repeat` line.
    #[error("repetition {repetition} of the block repeated by line {line}: {source}")]
    InRepeat {
        /// The repeat line.
        line: u64,
        /// Which repetition (from 1).
        repetition: u64,
        /// The problem, naming the line that states the event.
        source: Box<TraceError>,
    },
    /// The allocator is not tracing.
    #[error(
        "tracing is off, so there is no trace to write: enable it before the run with \
         AllocatorConfig::trace_capacity or Allocator::enable_trace"
    )]
    NotTracing,
}

/// A whole trace: header and events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceFile {
    /// Line 1.
    pub header: TraceHeader,
    /// The event lines, in order.
    pub events: Vec<TraceRecord>,
}

impl TraceFile {
    /// A complete trace of `events` (for traces made by hand or by a generator rather than
    /// recorded); fills in the counts. Check it with [`TraceFile::validate`].
    pub fn from_records(
        device: TraceDevice,
        config: TraceConfig,
        events: Vec<TraceRecord>,
        note: Option<String>,
    ) -> TraceFile {
        TraceFile {
            header: TraceHeader {
                format: TRACE_FORMAT.to_string(),
                version: TRACE_VERSION,
                device,
                config,
                events: events.len() as u64,
                complete: true,
                dropped_events: 0,
                taken_events: 0,
                unmatched_frees: 0,
                ring_capacity: None,
                live_at_start: 0,
                graph_pool_allocs: 0,
                recorded: None,
                note,
            },
            events,
        }
    }

    /// Writes the header line and one line per event.
    pub fn write_to(&self, w: &mut dyn Write) -> Result<(), TraceError> {
        let mut w = std::io::BufWriter::new(w);
        write_line(&mut w, 1, &self.header)?;
        for (i, e) in self.events.iter().enumerate() {
            write_line(&mut w, i as u64 + 2, e)?;
        }
        w.flush().map_err(|source| TraceError::Io {
            line: self.events.len() as u64 + 1,
            source,
        })
    }

    /// Writes the trace to `path` (created or truncated).
    pub fn write_path(&self, path: &Path) -> Result<(), TraceError> {
        let file_err = |source| TraceError::File {
            path: path.to_path_buf(),
            source,
        };
        let mut f = std::fs::File::create(path).map_err(file_err)?;
        self.write_to(&mut f).map_err(|e| match e {
            TraceError::Io { source, .. } => file_err(source),
            other => other,
        })
    }

    /// The trace as text (what [`TraceFile::write_to`] writes).
    pub fn to_text(&self) -> String {
        let mut out = Vec::new();
        // Writing to a Vec cannot fail, and every field serializes.
        if self.write_to(&mut out).is_err() {
            return String::new();
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Reads and checks a trace.
    pub fn read(reader: impl BufRead) -> Result<TraceFile, TraceError> {
        let mut lines = reader.lines();
        let first = match lines.next() {
            None => return Err(TraceError::Empty),
            Some(r) => r.map_err(|source| TraceError::Io { line: 1, source })?,
        };
        if first.trim().is_empty() {
            return Err(TraceError::Empty);
        }
        let header = parse_header(&first)?;
        let mut events = Vec::new();
        // Blank lines are allowed at the end only, so that event i is always on line i + 2.
        let mut blank_at = None;
        for (i, text) in lines.enumerate() {
            let line = i as u64 + 2;
            let text = text.map_err(|source| TraceError::Io { line, source })?;
            if text.trim().is_empty() {
                blank_at.get_or_insert(line);
                continue;
            }
            if let Some(blank) = blank_at {
                return Err(TraceError::Garbled {
                    line: blank,
                    problem: "an empty line between events".to_string(),
                });
            }
            let record: TraceRecord =
                serde_json::from_str(&text).map_err(|e| TraceError::Garbled {
                    line,
                    problem: e.to_string(),
                })?;
            events.push(record);
        }
        let file = TraceFile { header, events };
        // Events first: a problem on a line is more precise than a count that does not match.
        file.check_events()?;
        let found = file.events.len() as u64;
        if found != file.header.events {
            return Err(TraceError::CountMismatch {
                expected: file.header.events,
                found,
                hint: if found < file.header.events {
                    "the file was cut short (a write that did not finish, or a truncated copy)"
                } else {
                    "lines were added after the file was written"
                },
            });
        }
        Ok(file)
    }

    /// Reads and checks the trace at `path`.
    pub fn read_path(path: &Path) -> Result<TraceFile, TraceError> {
        let f = std::fs::File::open(path).map_err(|source| TraceError::File {
            path: path.to_path_buf(),
            source,
        })?;
        TraceFile::read(std::io::BufReader::new(f))
    }

    /// Reads and checks a trace held in a string.
    pub fn parse(text: &str) -> Result<TraceFile, TraceError> {
        TraceFile::read(text.as_bytes())
    }

    /// Runs the checks reading does, on a trace built in memory (lines numbered as in the
    /// file).
    pub fn validate(&self) -> Result<(), TraceError> {
        check_header(&self.header)?;
        if self.header.events != self.events.len() as u64 {
            return Err(TraceError::CountMismatch {
                expected: self.header.events,
                found: self.events.len() as u64,
                hint: "the header's count does not match the events",
            });
        }
        self.check_events()
    }

    /// How many events the trace has once `repeat` lines are expanded.
    pub fn expanded_len(&self) -> Result<u64, TraceError> {
        // prefix[i]: events produced by lines 0..i. A repeat's block is the lines just before
        // it, so it produced prefix[i] - prefix[i - k] events, and the repeat that many times
        // `times` more.
        let mut prefix = Vec::with_capacity(self.events.len() + 1);
        prefix.push(0u64);
        for (i, record) in self.events.iter().enumerate() {
            let line = i as u64 + 2;
            let before = prefix[i];
            let produced = match *record {
                TraceRecord::Repeat { lines, times, .. } => {
                    let bad = |problem: String| TraceError::BadRepeat { line, problem };
                    if lines == 0 || lines > i as u64 {
                        return Err(bad(format!(
                            "it repeats {lines} lines, but {i} event lines come before it                              (a block is 1 or more of the lines just before the repeat)"
                        )));
                    }
                    if times == 0 {
                        return Err(bad(
                            "\"times\" is 0; a repeat adds 1 or more repetitions".into()
                        ));
                    }
                    let block = before - prefix[i - lines as usize];
                    block.checked_mul(times).ok_or_else(|| {
                        bad(format!("it expands past {MAX_EXPANDED_EVENTS} events"))
                    })?
                }
                _ => 1,
            };
            match before.checked_add(produced) {
                Some(n) if n <= MAX_EXPANDED_EVENTS => prefix.push(n),
                _ => {
                    return Err(TraceError::BadRepeat {
                        line,
                        problem: format!(
                            "the trace expands past {MAX_EXPANDED_EVENTS} events; repeat fewer \
                             times"
                        ),
                    })
                }
            }
        }
        Ok(prefix[self.events.len()])
    }

    /// Calls `f` with every event in the order they happen, `repeat` lines expanded (a repeat
    /// line itself is not passed). `f` stops the walk by returning `Break`. Errors are those of
    /// the trace's structure (a bad repeat); the events themselves are checked by
    /// [`TraceFile::validate`].
    pub fn for_each_event(
        &self,
        f: &mut dyn FnMut(EventAt, TraceRecord) -> std::ops::ControlFlow<()>,
    ) -> Result<(), TraceError> {
        self.expanded_len()?;
        let mut index = 0;
        self.visit(0..self.events.len(), 0, None, &mut index, f)
            .map(|_| ())
    }

    /// Walks `range` of the lines, shifted by `shift` ns, within repetition `via`. Returns
    /// whether `f` asked to stop.
    fn visit(
        &self,
        range: std::ops::Range<usize>,
        shift: u64,
        via: Option<(u64, u64)>,
        index: &mut u64,
        f: &mut dyn FnMut(EventAt, TraceRecord) -> std::ops::ControlFlow<()>,
    ) -> Result<bool, TraceError> {
        let start = range.start;
        for i in range {
            let line = i as u64 + 2;
            let record = self.events[i];
            if let TraceRecord::Repeat { t, lines, times } = record {
                let bad = |problem: String| TraceError::BadRepeat { line, problem };
                // `expanded_len` checked 1 <= lines <= i.
                let first = i - lines as usize;
                if first < start {
                    return Err(bad(format!(
                        "its block (lines {}-{}) starts before line {}, where the block \
                         repeated by line {} begins: repeated blocks may nest but not partly \
                         overlap",
                        first + 2,
                        line - 1,
                        start + 2,
                        via.map_or(0, |v| v.0)
                    )));
                }
                let period = t.checked_sub(self.events[first].t()).ok_or_else(|| {
                    bad(format!(
                        "its time {t} is before its block's first event ({} ns)",
                        self.events[first].t()
                    ))
                })?;
                for r in 1..=times {
                    let by = period
                        .checked_mul(r)
                        .and_then(|p| p.checked_add(shift))
                        .ok_or_else(|| bad("the repeated times overflow 64 bits".into()))?;
                    if self.visit(first..i, by, Some((line, r)), index, f)? {
                        return Ok(true);
                    }
                }
                continue;
            }
            let shifted = record.shifted(shift).ok_or_else(|| TraceError::BadRepeat {
                line: via.map_or(line, |v| v.0),
                problem: "the repeated times overflow 64 bits".into(),
            })?;
            let at = EventAt {
                index: *index,
                line,
                repeat: via,
            };
            *index += 1;
            if f(at, shifted).is_break() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The per-event checks, over the expanded events.
    fn check_events(&self) -> Result<(), TraceError> {
        let mut checker = Checker {
            live: HashMap::new(),
            previous: 0,
            complete: self.header.complete,
        };
        let mut found = Ok(());
        self.for_each_event(&mut |at, record| match checker.check(at.line, &record) {
            Ok(()) => std::ops::ControlFlow::Continue(()),
            Err(e) => {
                found = Err(match at.repeat {
                    Some((line, repetition)) => TraceError::InRepeat {
                        line,
                        repetition,
                        source: Box::new(e),
                    },
                    None => e,
                });
                std::ops::ControlFlow::Break(())
            }
        })?;
        found
    }
}

/// Writes `value` as one JSON line.
fn write_line<T: Serialize>(w: &mut impl Write, line: u64, value: &T) -> Result<(), TraceError> {
    serde_json::to_writer(&mut *w, value)
        .map_err(std::io::Error::other)
        .and_then(|()| w.write_all(b"\n"))
        .map_err(|source| TraceError::Io { line, source })
}

fn parse_header(text: &str) -> Result<TraceHeader, TraceError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| TraceError::NotATrace {
            problem: format!("not JSON: {e}"),
        })?;
    let format = value.get("format").and_then(|f| f.as_str());
    if format != Some(TRACE_FORMAT) {
        return Err(TraceError::NotATrace {
            problem: match format {
                Some(f) => format!("\"format\" is {f:?}"),
                None => "no \"format\" field".to_string(),
            },
        });
    }
    match value.get("version").and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(TRACE_VERSION) => {}
        Some(found) => return Err(TraceError::UnsupportedVersion { found }),
        None => {
            return Err(TraceError::BadHeader {
                problem: "\"version\" is missing or not a whole number".to_string(),
            })
        }
    }
    let header: TraceHeader = serde_json::from_value(value).map_err(|e| TraceError::BadHeader {
        problem: e.to_string(),
    })?;
    check_header(&header)?;
    Ok(header)
}

fn check_header(h: &TraceHeader) -> Result<(), TraceError> {
    let bad = |problem: String| Err(TraceError::BadHeader { problem });
    if h.format != TRACE_FORMAT {
        return bad(format!("\"format\" is {:?}", h.format));
    }
    if h.version != TRACE_VERSION {
        return Err(TraceError::UnsupportedVersion {
            found: u64::from(h.version),
        });
    }
    let losses = h.dropped_events + h.taken_events + h.unmatched_frees;
    if h.complete && losses > 0 {
        return bad(format!(
            "\"complete\" is true but {} events were dropped, {} taken and {} frees unmatched",
            h.dropped_events, h.taken_events, h.unmatched_frees
        ));
    }
    if let Some(uma) = h.device.uma {
        if uma.carve_out.checked_add(uma.gtt).is_none() {
            return bad("the UMA carve-out plus GTT overflows 64 bits".to_string());
        }
    }
    Ok(())
}

/// The per-event checks shared by reading and [`TraceFile::validate`]. An incomplete trace
/// (`complete` false) may free or use allocations it does not show, since those events were
/// lost; it is still read, so that replay can say why it refuses it and how to record a
/// complete one.
struct Checker {
    /// id -> (line, size, tag, stream) of live allocations.
    live: HashMap<u64, (u64, u64, Tag, u64)>,
    previous: u64,
    complete: bool,
}

impl Checker {
    fn check(&mut self, line: u64, record: &TraceRecord) -> Result<(), TraceError> {
        let (live, complete) = (&mut self.live, self.complete);
        let t = record.t();
        if t < self.previous {
            return Err(TraceError::TimeGoesBack {
                line,
                t,
                previous: self.previous,
            });
        }
        self.previous = t;
        match *record {
            TraceRecord::Alloc {
                id,
                size,
                tag,
                stream,
                ..
            } => {
                if size == 0 {
                    return Err(TraceError::ZeroSize { line, id });
                }
                if let Some(&(first_line, ..)) = live.get(&id) {
                    return Err(TraceError::DuplicateId {
                        line,
                        id,
                        first_line,
                    });
                }
                live.insert(id, (line, size, tag, stream));
            }
            TraceRecord::Free {
                id,
                size,
                tag,
                stream,
                ..
            } => {
                let Some((alloc_line, a_size, a_tag, a_stream)) = live.remove(&id) else {
                    if !complete {
                        return Ok(());
                    }
                    return Err(TraceError::WithoutAlloc {
                        line,
                        what: "free",
                        id,
                    });
                };
                let mismatch = |field, found: String, expected: String| TraceError::Mismatch {
                    line,
                    id,
                    field,
                    found,
                    expected,
                    alloc_line,
                };
                if size != a_size {
                    return Err(mismatch("size", size.to_string(), a_size.to_string()));
                }
                if tag != a_tag {
                    return Err(mismatch("tag", tag.to_string(), a_tag.to_string()));
                }
                if stream != a_stream {
                    return Err(mismatch("stream", stream.to_string(), a_stream.to_string()));
                }
            }
            TraceRecord::Use { id, .. } => {
                if complete && !live.contains_key(&id) {
                    return Err(TraceError::WithoutAlloc {
                        line,
                        what: "use",
                        id,
                    });
                }
            }
            TraceRecord::DeviceAlloc { .. }
            | TraceRecord::DeviceFree { .. }
            | TraceRecord::Weights { .. }
            | TraceRecord::MemoryLimit { .. }
            | TraceRecord::CacheLimit { .. }
            | TraceRecord::Repeat { .. } => {}
        }
        Ok(())
    }
}

/// A live allocation as the ring knows it.
#[derive(Clone, Copy, Debug)]
struct LiveAlloc {
    id: u64,
    requested: u64,
}

/// An allocation already live when tracing began.
pub(crate) struct LiveBlock {
    pub addr: u64,
    pub size: u64,
    pub tag: Tag,
    pub stream: StreamId,
}

/// Ring buffer keeping the most recent `capacity` events, plus what a trace file needs to say
/// whether it is complete.
#[derive(Debug)]
pub(crate) struct Trace {
    start: Instant,
    capacity: usize,
    events: VecDeque<TraceEvent>,
    /// Dropped since the last `take` (what `TraceLog::dropped` reports).
    dropped: u64,
    /// Dropped since tracing began.
    dropped_total: u64,
    /// Handed out by `take`.
    taken: u64,
    /// Allocations live when tracing began, as alloc events at t = 0 (never dropped).
    prologue: Vec<TraceEvent>,
    next_id: u64,
    live: HashMap<u64, LiveAlloc>,
    unmatched_frees: u64,
    graph_allocs: u64,
    config: TraceConfig,
}

impl Trace {
    /// An empty trace of at most `capacity` events (memory grows as events arrive).
    pub fn new(capacity: usize, config: TraceConfig) -> Trace {
        Self::with_live(capacity, config, Vec::new())
    }

    /// A trace that starts with `live` allocations already handed out.
    pub fn with_live(capacity: usize, config: TraceConfig, live: Vec<LiveBlock>) -> Trace {
        let capacity = capacity.max(1);
        let mut t = Trace {
            start: Instant::now(),
            capacity,
            // Not the whole capacity up front: a generous capacity should cost nothing until
            // events arrive.
            events: VecDeque::with_capacity(capacity.min(4096)),
            dropped: 0,
            dropped_total: 0,
            taken: 0,
            prologue: Vec::with_capacity(live.len()),
            next_id: 1,
            live: HashMap::with_capacity(live.len().max(64)),
            unmatched_frees: 0,
            graph_allocs: 0,
            config,
        };
        for b in live {
            let id = t.new_id(b.addr, b.size);
            t.prologue.push(TraceEvent {
                t_ns: 0,
                kind: TraceKind::Alloc,
                addr: b.addr,
                size: b.size,
                tag: b.tag,
                stream: b.stream,
                id,
                requested: b.size,
            });
        }
        t
    }

    fn new_id(&mut self, addr: u64, requested: u64) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.live.insert(addr, LiveAlloc { id, requested });
        id
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        kind: TraceKind,
        addr: u64,
        size: u64,
        tag: Tag,
        stream: StreamId,
        id: u64,
        requested: u64,
    ) {
        if self.events.len() == self.capacity {
            self.events.pop_front();
            self.dropped += 1;
            self.dropped_total += 1;
        }
        let t_ns = self.start.elapsed().as_nanos() as u64;
        self.events.push_back(TraceEvent {
            t_ns,
            kind,
            addr,
            size,
            tag,
            stream,
            id,
            requested,
        });
    }

    /// A user allocation: `block` bytes set aside for a request of `requested`; `graph` when
    /// it came from a graph-capture pool.
    pub fn record_alloc(
        &mut self,
        addr: u64,
        block: u64,
        requested: u64,
        tag: Tag,
        stream: StreamId,
        graph: bool,
    ) {
        if graph {
            self.graph_allocs += 1;
        }
        let id = self.new_id(addr, requested);
        self.push(TraceKind::Alloc, addr, block, tag, stream, id, requested);
    }

    /// A user free of the block at `addr`.
    pub fn record_free(&mut self, addr: u64, block: u64, tag: Tag, stream: StreamId) {
        let (id, requested) = match self.live.remove(&addr) {
            Some(a) => (a.id, a.requested),
            None => {
                self.unmatched_frees += 1;
                (0, block)
            }
        };
        self.push(TraceKind::Free, addr, block, tag, stream, id, requested);
    }

    /// `record_stream(stream)` on the allocation at `addr`.
    pub fn record_use(&mut self, addr: u64, stream: StreamId) {
        let id = self.live.get(&addr).map_or(0, |a| a.id);
        self.push(TraceKind::StreamUse, addr, 0, Tag::Other, stream, id, 0);
    }

    /// A device call of the recording allocator.
    pub fn record_device(&mut self, kind: TraceKind, addr: u64, size: u64) {
        self.push(kind, addr, size, Tag::Other, StreamId::DEFAULT, 0, 0);
    }

    /// `set_weight_bytes(bytes)`.
    pub fn record_weights(&mut self, bytes: u64) {
        let kind = TraceKind::WeightBytes;
        self.push(kind, 0, bytes, Tag::Other, StreamId::DEFAULT, 0, 0);
    }

    /// A limit set through the API ([`TraceKind::MemoryLimit`] or [`TraceKind::CacheLimit`]).
    pub fn record_limit(&mut self, kind: TraceKind) {
        self.push(kind, 0, 0, Tag::Other, StreamId::DEFAULT, 0, 0);
    }

    /// Removes and returns the recorded events and the number dropped for lack of room since
    /// the last take. A file written later lacks these events and says so.
    pub fn take(&mut self) -> (Vec<TraceEvent>, u64) {
        let dropped = std::mem::take(&mut self.dropped);
        let mut events: Vec<TraceEvent> = self.prologue.drain(..).collect();
        events.extend(self.events.drain(..));
        self.taken += events.len() as u64;
        (events, dropped)
    }

    /// The trace as a file, leaving the ring as it is.
    pub fn to_file(&self, device: TraceDevice, recorded: RecordedCounters) -> TraceFile {
        let events: Vec<TraceRecord> = self
            .prologue
            .iter()
            .chain(self.events.iter())
            .map(record_of)
            .collect();
        TraceFile {
            header: TraceHeader {
                format: TRACE_FORMAT.to_string(),
                version: TRACE_VERSION,
                device,
                config: self.config.clone(),
                events: events.len() as u64,
                complete: self.dropped_total == 0 && self.taken == 0 && self.unmatched_frees == 0,
                dropped_events: self.dropped_total,
                taken_events: self.taken,
                unmatched_frees: self.unmatched_frees,
                ring_capacity: Some(self.capacity as u64),
                live_at_start: self.prologue.len() as u64,
                graph_pool_allocs: self.graph_allocs,
                recorded: Some(recorded),
                note: None,
            },
            events,
        }
    }
}

/// The file line of a ring event.
fn record_of(e: &TraceEvent) -> TraceRecord {
    let t = e.t_ns;
    match e.kind {
        TraceKind::Alloc => TraceRecord::Alloc {
            t,
            id: e.id,
            size: e.requested,
            block: Some(e.size),
            tag: e.tag,
            stream: e.stream.value(),
        },
        TraceKind::Free => TraceRecord::Free {
            t,
            id: e.id,
            size: e.requested,
            tag: e.tag,
            stream: e.stream.value(),
        },
        TraceKind::StreamUse => TraceRecord::Use {
            t,
            id: e.id,
            stream: e.stream.value(),
        },
        TraceKind::DeviceAlloc => TraceRecord::DeviceAlloc { t, size: e.size },
        TraceKind::DeviceFree => TraceRecord::DeviceFree { t, size: e.size },
        TraceKind::WeightBytes => TraceRecord::Weights { t, bytes: e.size },
        TraceKind::MemoryLimit(bytes) => TraceRecord::MemoryLimit { t, bytes },
        TraceKind::CacheLimit(bytes) => TraceRecord::CacheLimit { t, bytes },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> TraceConfig {
        TraceConfig {
            memory_limit: Some(1 << 30),
            cache_limit: None,
            cache_limit_explicit: false,
            weight_bytes: 0,
            trim_hot_window: 4096,
        }
    }

    #[test]
    fn keeps_the_most_recent_events() {
        let mut t = Trace::new(2, config());
        for addr in 1..=3 {
            t.record_alloc(addr, 512, 500, Tag::Other, StreamId::DEFAULT, false);
        }
        let (events, dropped) = t.take();
        assert_eq!(dropped, 1);
        assert_eq!(
            events.iter().map(|e| e.addr).collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert_eq!(events.iter().map(|e| e.id).collect::<Vec<_>>(), vec![2, 3]);
        assert!(events[0].t_ns <= events[1].t_ns);
    }

    #[test]
    fn frees_name_their_allocation_when_addresses_are_reused() {
        let mut t = Trace::new(16, config());
        t.record_alloc(0x1000, 512, 100, Tag::Activations, StreamId::DEFAULT, false);
        t.record_free(0x1000, 512, Tag::Activations, StreamId::DEFAULT);
        t.record_alloc(0x1000, 512, 200, Tag::Workspace, StreamId::DEFAULT, false);
        t.record_free(0x1000, 512, Tag::Workspace, StreamId::DEFAULT);
        let file = t.to_file(
            TraceDevice {
                name: "test".into(),
                total: 1 << 30,
                usable: 1 << 30,
                uma: None,
            },
            RecordedCounters::default(),
        );
        let ids: Vec<u64> = file
            .events
            .iter()
            .map(|r| match r {
                TraceRecord::Alloc { id, .. } | TraceRecord::Free { id, .. } => *id,
                _ => 0,
            })
            .collect();
        assert_eq!(ids, vec![1, 1, 2, 2]);
        assert!(file.header.complete);
        file.validate().unwrap();
    }

    #[test]
    fn a_free_without_a_traced_allocation_makes_the_trace_incomplete() {
        let mut t = Trace::new(16, config());
        t.record_free(0x1000, 512, Tag::Other, StreamId::DEFAULT);
        let file = t.to_file(
            TraceDevice {
                name: "test".into(),
                total: 1,
                usable: 1,
                uma: None,
            },
            RecordedCounters::default(),
        );
        assert!(!file.header.complete);
        let why = file.header.incompleteness().unwrap();
        assert!(why.contains("never saw"), "{why}");
    }
}
