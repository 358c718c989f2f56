//! Replaying an allocation trace on a simulated device: would this run fit on that machine,
//! with the limits it had, with the defaults the allocator picks there, or with no limits?
//!
//! [`replay`] feeds a trace's user events, in file order (which is time order), into a fresh
//! [`Allocator`] over a [`SimDevice`] built from a profile, and reports the peaks (reserved,
//! allocated, cached, per tag), the device calls, and whether the run fits. An out-of-memory
//! error is not a failure of the replay but its answer: the report names the event, the
//! request and the allocator's breakdown at that point. On a UMA profile a run that completes
//! can still not fit: GTT pages are host RAM, and a run whose GTT use exceeds host RAM minus
//! the OS's reserve ([`SimConfig::gtt_budget`]) would starve the OS rather than get an error.
//!
//! Streams and time. Each stream number in the trace becomes a stream of the simulated device
//! (0 stays the null stream). Cross-stream frees take the allocator's real deferred path: a
//! `use` event is a `record_stream`, and freeing that allocation records an event on the other
//! stream. The simulated device completes a stream's work only when told, so the replay
//! decides when: before each event on a stream (an alloc or free on it, or a `use` by it), the
//! work that stream had queued is complete, and after it, the stream has new work queued. So a
//! block freed while another stream uses it stays pending until that stream's next event in
//! the trace, then is reused from the next allocation on. A stream that never shows up again
//! keeps it pending, as a stranded side stream would, and the out-of-memory path waits for it
//! as the real one does. Timestamps only order events; no real or simulated time passes
//! between them.
//!
//! What a trace does not carry: graph captures (allocations made into a capture's private pool
//! are replayed into the ordinary pools; the header counts them), memory taken outside the
//! allocator (runtime context, code objects, library workspaces), and the environment (the
//! replay never reads `HIPDECODE_*` variables).

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use crate::allocator::{Allocation, Allocator};
use crate::config::AllocatorConfig;
use crate::device::StreamId;
use crate::devices::sim::{DeviceProfile, SimConfig, SimDevice};
use crate::error::AllocError;
use crate::limits::LimitSpec;
use crate::oom::{fmt_bytes, OomReport};
use crate::stats::Stats;
use crate::tag::Tag;
use crate::trace::{EventAt, TraceError, TraceFile, TraceRecord};

/// Which limits the replaying allocator uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitsMode {
    /// The limits the trace was recorded with (its header, and any limits set through the API
    /// during the run). A cache limit that was the default is replayed as today's default,
    /// [`crate::limits::DEFAULT_CACHE_LIMIT`]; traces recorded before 2026-11-30 had a default
    /// that grew with reported weights (256 MiB + 12.5 %), which is not reproduced.
    Trace,
    /// What [`AllocatorConfig::default`] picks on the simulated device (memory limit from its
    /// size and UMA layout, cache limit [`crate::limits::DEFAULT_CACHE_LIMIT`]), without the
    /// environment.
    Default,
    /// No memory limit and no cache limit: the cache keeps everything until the device runs
    /// out, as an unbounded caching allocator does.
    None,
}

impl LimitsMode {
    /// Every mode.
    pub const ALL: [LimitsMode; 3] = [LimitsMode::Trace, LimitsMode::Default, LimitsMode::None];

    /// The name `FromStr` accepts.
    pub fn name(self) -> &'static str {
        match self {
            LimitsMode::Trace => "trace",
            LimitsMode::Default => "default",
            LimitsMode::None => "none",
        }
    }
}

impl std::fmt::Display for LimitsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A limits mode name that is not one of `trace`, `default`, `none`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown limits {0:?}: use \"trace\" (the trace's own limits), \"default\" (what the \
     allocator picks on the simulated device) or \"none\" (unbounded)"
)]
pub struct UnknownLimitsMode(pub String);

impl std::str::FromStr for LimitsMode {
    type Err = UnknownLimitsMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase();
        LimitsMode::ALL
            .into_iter()
            .find(|m| m.name() == wanted)
            .ok_or_else(|| UnknownLimitsMode(s.to_string()))
    }
}

/// Where a replay ran out of memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OomPoint {
    /// Which event: its index among the events as they happen (from 0) and its line.
    pub at: EventAt,
    /// Its time.
    pub t_ns: u64,
    /// The allocation id.
    pub id: u64,
    /// Bytes requested.
    pub requested: u64,
    /// Its tag.
    pub tag: Tag,
    /// Its stream number in the trace.
    pub stream: u64,
    /// The allocator's breakdown at that point.
    pub report: OomReport,
}

/// Whether the run fits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every event replayed; on a UMA device, the OS kept its reserve.
    Fits,
    /// An allocation failed; the replay stopped there.
    OutOfMemory(Box<OomPoint>),
    /// Every event replayed, but on a UMA device GTT took host RAM the OS needs.
    HostOvercommit {
        /// Highest GTT use.
        gtt_peak: u64,
        /// GTT bytes available while the OS keeps its reserve.
        gtt_budget: u64,
        /// The OS's reserve.
        host_reserve: u64,
    },
}

/// What a replay found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayReport {
    /// The simulated device, in words.
    pub device: String,
    /// The limits mode.
    pub limits: LimitsMode,
    /// Memory limit when the replay began (`None` = unbounded).
    pub memory_limit: Option<u64>,
    /// Cache limit when the replay began (`None` = unbounded).
    pub cache_limit: Option<u64>,
    /// Cache limit at the end (a default one follows reported weights).
    pub final_cache_limit: Option<u64>,
    /// Events in the trace (`repeat` lines expanded).
    pub events: usize,
    /// Events replayed (all of them, unless an allocation failed).
    pub replayed: usize,
    /// Highest bytes reserved from the device.
    pub peak_reserved: u64,
    /// Highest bytes allocated (active).
    pub peak_allocated: u64,
    /// Highest reserved − allocated seen after any event: what the cache held.
    pub peak_cached: u64,
    /// Peak active bytes per tag, tags never used left out, in [`Tag::ALL`] order.
    pub per_tag_peak: Vec<(Tag, u64)>,
    /// Device allocations the replaying allocator made.
    pub device_mallocs: u64,
    /// Device frees it made (not counting those when the replay ended).
    pub device_frees: u64,
    /// The counters after the last event replayed.
    pub end: Stats,
    /// On a UMA device: the highest GTT use (allocations fill the carve-out first).
    pub gtt_peak: Option<u64>,
    /// On a UMA device: GTT bytes available while the OS keeps its reserve.
    pub gtt_budget: Option<u64>,
    /// Things the reader should know about this replay.
    pub notes: Vec<String>,
    /// Whether it fits.
    pub verdict: Verdict,
}

impl ReplayReport {
    /// Whether the run fits.
    pub fn fits(&self) -> bool {
        self.verdict == Verdict::Fits
    }

    /// Peak active bytes of one tag.
    pub fn tag_peak(&self, tag: Tag) -> u64 {
        self.per_tag_peak
            .iter()
            .find(|(t, _)| *t == tag)
            .map_or(0, |&(_, b)| b)
    }

    /// The verdict in a few words, for a table cell.
    pub fn verdict_short(&self) -> String {
        match &self.verdict {
            Verdict::Fits => "fits".to_string(),
            Verdict::OutOfMemory(p) => format!("OOM at event {}", p.at.index),
            Verdict::HostOvercommit { .. } => "no: GTT eats the OS's RAM".to_string(),
        }
    }

    /// The verdict in full.
    pub fn verdict_long(&self) -> String {
        match &self.verdict {
            Verdict::Fits => "fits".to_string(),
            Verdict::OutOfMemory(p) => format!(
                "out of memory at event {} ({}, t = {} ns): {} of {} on stream {} (allocation \
                 id {}); {}",
                p.at.index,
                p.at,
                p.t_ns,
                fmt_bytes(p.requested),
                p.tag,
                p.stream,
                p.id,
                p.report
            ),
            Verdict::HostOvercommit {
                gtt_peak,
                gtt_budget,
                host_reserve,
            } => format!(
                "does not fit: GTT use peaks at {}, but only {} of host RAM is free for it once \
                 the OS keeps its {} reserve; the run would push the OS into swap or the OOM \
                 killer",
                fmt_bytes(*gtt_peak),
                fmt_bytes(*gtt_budget),
                fmt_bytes(*host_reserve)
            ),
        }
    }
}

/// Why a replay could not run. Running out of memory is not one of these: it is a
/// [`Verdict`].
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The trace lost events, so a replay would undercount.
    #[error("the trace is incomplete, so a replay would undercount memory: {0}")]
    Incomplete(String),
    /// The trace fails its checks.
    #[error("the trace is invalid: {0}")]
    Invalid(#[from] TraceError),
    /// The replaying allocator could not be created.
    #[error("could not create the replaying allocator: {0}")]
    Setup(AllocError),
    /// The allocator failed on an event for a reason other than memory.
    #[error("line {line}: the replaying allocator failed: {source}")]
    Allocator {
        /// The event's line.
        line: u64,
        /// What failed.
        source: AllocError,
    },
}

/// How far a replay has got, for progress reports on long traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Events replayed.
    pub done: usize,
    /// Events in the trace.
    pub total: usize,
}

/// How often the progress callback is called, in events.
pub const PROGRESS_EVERY: usize = 1 << 16;

/// Replays `trace` on the simulated device of `profile` under `limits`.
pub fn replay(
    trace: &TraceFile,
    profile: DeviceProfile,
    limits: LimitsMode,
) -> Result<ReplayReport, ReplayError> {
    let device = format!("{profile}: {}", profile.description());
    replay_on(trace, profile.config(), device, limits, None)
}

/// Replays `trace` on a simulated device configured by `config` (described as `device` in
/// the report), calling `progress` every [`PROGRESS_EVERY`] events.
pub fn replay_on(
    trace: &TraceFile,
    config: SimConfig,
    device: String,
    limits: LimitsMode,
    mut progress: Option<&mut dyn FnMut(Progress)>,
) -> Result<ReplayReport, ReplayError> {
    if let Some(why) = trace.header.incompleteness() {
        return Err(ReplayError::Incomplete(why));
    }
    trace.validate()?;
    let sim = Arc::new(SimDevice::new(config.clone()));
    let header = &trace.header;
    let base = AllocatorConfig {
        read_env: false,
        weight_bytes: header.config.weight_bytes,
        trace_capacity: None,
        ..AllocatorConfig::default()
    };
    let spec = |limit: Option<u64>| Some(limit.map_or(LimitSpec::Unbounded, LimitSpec::Bytes));
    let alloc_config = match limits {
        LimitsMode::Trace => AllocatorConfig {
            memory_limit: spec(header.config.memory_limit),
            // A default cache limit is left to today's default (see `LimitsMode::Trace`).
            cache_limit: if header.config.cache_limit_explicit {
                spec(header.config.cache_limit)
            } else {
                None
            },
            trim_hot_window: header.config.trim_hot_window,
            ..base
        },
        LimitsMode::Default => base,
        LimitsMode::None => AllocatorConfig {
            memory_limit: Some(LimitSpec::Unbounded),
            cache_limit: Some(LimitSpec::Unbounded),
            ..base
        },
    };
    let alloc = Allocator::new(sim.clone(), alloc_config).map_err(ReplayError::Setup)?;
    let mut notes = Vec::new();
    if header.graph_pool_allocs > 0 {
        notes.push(format!(
            "{} allocations were made into graph-capture pools in the recorded run; the trace \
             does not record captures, so they were replayed into the ordinary pools",
            header.graph_pool_allocs
        ));
    }
    if header.live_at_start > 0 {
        notes.push(format!(
            "tracing began with {} allocations live; they are replayed first, in address \
             order, without the cache the recorded run had built by then",
            header.live_at_start
        ));
    }
    let mut run = Run {
        sim: &sim,
        alloc: &alloc,
        streams: HashMap::new(),
        live: HashMap::new(),
        peak_cached: 0,
    };
    let (memory_limit, cache_limit) = (alloc.memory_limit(), alloc.cache_limit());
    let total = trace.expanded_len()? as usize;
    let mut verdict = Verdict::Fits;
    let mut replayed = 0;
    let mut ignored_limits = None;
    let mut failure = None;
    trace.for_each_event(&mut |at, record| {
        match run.step(&record, limits, at.line) {
            Ok(Step::Done) => {}
            Ok(Step::LimitsIgnored) => {
                ignored_limits.get_or_insert(at.line);
            }
            Ok(Step::LimitRefused(why)) => notes.push(why),
            Ok(Step::OutOfMemory(report)) => {
                if let TraceRecord::Alloc {
                    t,
                    id,
                    size,
                    tag,
                    stream,
                    ..
                } = record
                {
                    verdict = Verdict::OutOfMemory(Box::new(OomPoint {
                        at,
                        t_ns: t,
                        id,
                        requested: size,
                        tag,
                        stream,
                        report,
                    }));
                }
                return ControlFlow::Break(());
            }
            Err(e) => {
                failure = Some(e);
                return ControlFlow::Break(());
            }
        }
        replayed += 1;
        if replayed % PROGRESS_EVERY == 0 {
            if let Some(p) = progress.as_deref_mut() {
                p(Progress {
                    done: replayed,
                    total,
                });
            }
        }
        ControlFlow::Continue(())
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    if let Some(line) = ignored_limits {
        notes.push(format!(
            "the trace sets limits through the API (first on line {line}); under {limits} \
             limits they were ignored"
        ));
    }
    let end = alloc.stats();
    let sim_stats = sim.stats();
    let gtt_peak = config.uma.map(|_| config.gtt_used(sim_stats.peak_used));
    let gtt_budget = config.gtt_budget();
    if let (Verdict::Fits, Some(peak), Some(budget), Some(reserve)) =
        (&verdict, gtt_peak, gtt_budget, config.host_reserve())
    {
        if peak > budget {
            verdict = Verdict::HostOvercommit {
                gtt_peak: peak,
                gtt_budget: budget,
                host_reserve: reserve,
            };
        }
    }
    let report = ReplayReport {
        device,
        limits,
        memory_limit,
        cache_limit,
        final_cache_limit: end.cache_limit,
        events: total,
        replayed,
        peak_reserved: end.peak_reserved_bytes,
        peak_allocated: end.peak_active_bytes,
        peak_cached: run.peak_cached,
        per_tag_peak: end
            .per_tag
            .iter()
            .filter(|(_, u)| u.peak > 0)
            .map(|&(t, u)| (t, u.peak))
            .collect(),
        device_mallocs: end.device_allocs,
        device_frees: end.device_frees,
        end,
        gtt_peak,
        gtt_budget,
        notes,
        verdict,
    };
    // Live allocations go back before the allocator, which then returns its segments.
    drop(run);
    Ok(report)
}

/// What one event did.
enum Step {
    Done,
    LimitsIgnored,
    LimitRefused(String),
    OutOfMemory(OomReport),
}

/// The state of a replay in progress.
struct Run<'a> {
    sim: &'a SimDevice,
    alloc: &'a Allocator,
    /// Trace stream number -> simulated stream.
    streams: HashMap<u64, StreamId>,
    /// Trace allocation id -> the replayed allocation.
    live: HashMap<u64, Allocation>,
    peak_cached: u64,
}

impl Run<'_> {
    fn stream(&mut self, number: u64) -> StreamId {
        if number == 0 {
            return StreamId::DEFAULT;
        }
        let sim = self.sim;
        *self
            .streams
            .entry(number)
            .or_insert_with(|| sim.create_stream())
    }

    /// Runs `f` as work of the trace's stream `number`: what that stream queued before is
    /// complete now, and it has queued new work afterwards (see the module docs).
    fn on_stream<T>(&mut self, number: u64, f: impl FnOnce(&mut Self, StreamId) -> T) -> T {
        let s = self.stream(number);
        self.sim.complete_stream(s);
        let out = f(self, s);
        self.sim.submit_work(s);
        out
    }

    fn step(
        &mut self,
        record: &TraceRecord,
        limits: LimitsMode,
        line: u64,
    ) -> Result<Step, ReplayError> {
        let failed = |source| ReplayError::Allocator { line, source };
        let step = match *record {
            TraceRecord::Alloc {
                id,
                size,
                tag,
                stream,
                ..
            } => {
                let result = self.on_stream(stream, |run, s| run.alloc.alloc(size, s, tag));
                match result {
                    Ok(a) => {
                        self.live.insert(id, a);
                        Step::Done
                    }
                    Err(AllocError::OutOfMemory(report)) => return Ok(Step::OutOfMemory(*report)),
                    Err(e) => return Err(failed(e)),
                }
            }
            TraceRecord::Free { id, stream, .. } => {
                // The trace was validated, so the id is live; a missing one is skipped.
                self.on_stream(stream, |run, _| run.live.remove(&id));
                Step::Done
            }
            TraceRecord::Use { id, stream, .. } => {
                let used = self.on_stream(stream, |run, s| {
                    run.live.get(&id).map(|a| a.record_stream(s))
                });
                if let Some(Err(e)) = used {
                    return Err(failed(e));
                }
                Step::Done
            }
            // The recording allocator's device calls are what the replay recomputes, and a
            // repeat line never reaches here (the walk expands it).
            TraceRecord::DeviceAlloc { .. }
            | TraceRecord::DeviceFree { .. }
            | TraceRecord::Repeat { .. } => Step::Done,
            TraceRecord::Weights { bytes, .. } => {
                self.alloc.set_weight_bytes(bytes);
                Step::Done
            }
            TraceRecord::MemoryLimit { bytes, .. } | TraceRecord::CacheLimit { bytes, .. } => {
                if limits != LimitsMode::Trace {
                    return Ok(Step::LimitsIgnored);
                }
                let spec = bytes.map_or(LimitSpec::Unbounded, LimitSpec::Bytes);
                let set = if matches!(record, TraceRecord::MemoryLimit { .. }) {
                    self.alloc.set_memory_limit(spec)
                } else {
                    self.alloc.set_cache_limit(spec)
                };
                match set {
                    Ok(()) => Step::Done,
                    Err(e) => Step::LimitRefused(format!(
                        "line {line}: the limits the trace sets could not be applied here: {e}"
                    )),
                }
            }
        };
        let st = self.alloc.stats();
        self.peak_cached = self.peak_cached.max(st.cached_bytes);
        Ok(step)
    }
}

/// The reports of one trace under several limits, side by side: peaks, device calls, GTT use
/// on UMA devices, peak per tag, and the verdict, then the details of every out-of-memory
/// point and the notes.
pub fn table(reports: &[ReplayReport]) -> String {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let limit = |l: Option<u64>| l.map_or("none".to_string(), fmt_bytes);
    let row = |name: &str, f: &dyn Fn(&ReplayReport) -> String| {
        (name.to_string(), reports.iter().map(f).collect::<Vec<_>>())
    };
    rows.push(row("limits", &|r| r.limits.to_string()));
    rows.push(row("memory limit", &|r| limit(r.memory_limit)));
    rows.push(row("cache limit", &|r| {
        if r.final_cache_limit != r.cache_limit {
            format!("{} -> {}", limit(r.cache_limit), limit(r.final_cache_limit))
        } else {
            limit(r.cache_limit)
        }
    }));
    rows.push(row("peak reserved", &|r| fmt_bytes(r.peak_reserved)));
    rows.push(row("peak allocated", &|r| fmt_bytes(r.peak_allocated)));
    rows.push(row("peak cached", &|r| fmt_bytes(r.peak_cached)));
    rows.push(row("device mallocs / frees", &|r| {
        format!("{} / {}", r.device_mallocs, r.device_frees)
    }));
    if reports.iter().any(|r| r.gtt_budget.is_some()) {
        rows.push(row(
            "GTT peak / budget",
            &|r| match (r.gtt_peak, r.gtt_budget) {
                (Some(p), Some(b)) => format!("{} / {}", fmt_bytes(p), fmt_bytes(b)),
                _ => "-".to_string(),
            },
        ));
    }
    rows.push(row("events replayed", &|r| {
        format!("{} of {}", r.replayed, r.events)
    }));
    let tags: Vec<Tag> = Tag::ALL
        .into_iter()
        .filter(|&t| reports.iter().any(|r| r.tag_peak(t) > 0))
        .collect();
    if !tags.is_empty() {
        rows.push((
            "peak by tag:".to_string(),
            vec![String::new(); reports.len()],
        ));
        for t in tags {
            rows.push(row(&format!("  {t}"), &|r| fmt_bytes(r.tag_peak(t))));
        }
    }
    rows.push(row("result", &|r| r.verdict_short()));
    let name_w = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let col_w: Vec<usize> = (0..reports.len())
        .map(|i| rows.iter().map(|(_, c)| c[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (name, cells) in &rows {
        let mut line = format!("{name:<name_w$}");
        for (cell, w) in cells.iter().zip(&col_w) {
            line.push_str(&format!("   {cell:>w$}"));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    for r in reports {
        if !r.fits() {
            out.push_str(&format!("\n{} limits: {}\n", r.limits, r.verdict_long()));
        }
        for n in &r.notes {
            out.push_str(&format!("\nnote ({} limits): {n}\n", r.limits));
        }
    }
    out
}
