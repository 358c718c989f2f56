//! The caching allocator: one mutex around the pool state, RAII allocations, raw FFI entry
//! points, limits, trimming and the out-of-memory path.
//!
//! Concurrency: a single `std::sync::Mutex` guards all state. The cache-hit path does one
//! binary search and removal in a size class (plus an insertion when the block is split), a few
//! slab writes and counter updates, so the critical section is short; device calls (only on a miss, a trim or
//! the OOM path) are made while holding it, like PyTorch, so that no other thread can observe
//! half-grown state.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::block::{BlockId, BlockState, SegmentId};
use crate::block_pool::{BlockPool, GraphPoolId, PoolKey, PoolOwner};
use crate::captures::Captures;
use crate::config::{AllocatorConfig, DEFAULT_TRIM_HOT_WINDOW};
use crate::deferred::{PendingFrees, StuckFree};
use crate::device::{DeviceError, MemoryInfo, RawDevice, StreamId};
use crate::error::AllocError;
use crate::limits::{self, LimitSpec};
use crate::oom::{fmt_bytes, OomCause, OomReport};
use crate::size_class::{kind_of, round_request, segment_size};
use crate::snapshot::{self, Snapshot, StreamRoles, StuckBlock};
use crate::stats::{Counters, Stats};
use crate::tag::Tag;
use crate::trace::{
    LiveBlock, RecordedCounters, Trace, TraceConfig, TraceDevice, TraceError, TraceEvent,
    TraceFile, TraceKind,
};

/// Hasher for device addresses: one multiply, then fold the high bits down so the bucket index
/// (low bits) is not constant for 512-aligned addresses.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
}

type AddrMap = HashMap<u64, BlockId, BuildHasherDefault<AddrHasher>>;

struct State {
    pool: BlockPool,
    counters: Counters,
    /// Blocks handed out through `raw_alloc`, by address.
    raw: AddrMap,
    pending: PendingFrees,
    /// Event failures not yet handed to [`Allocator::take_event_failures`].
    unreported_failures: Vec<StuckBlock>,
    captures: Captures,
    trace: Option<Trace>,
    memory_limit: Option<u64>,
    cache_limit: Option<u64>,
    cache_limit_explicit: bool,
    weight_bytes: u64,
    hot_window: u64,
    /// Bytes held by live decode arenas (also counted under their tag).
    arena_bytes: u64,
    /// Bytes mapped into growable regions, per tag (also active under their tag).
    mapped: [u64; Tag::COUNT],
    /// Which streams are the main one and which are retired, for the snapshot's stranded list.
    roles: StreamRoles,
}

impl State {
    /// Bytes obtained from the device: the pools' segments and the growable regions' pieces.
    fn reserved(&self) -> u64 {
        self.pool.reserved() + self.mapped.iter().sum::<u64>()
    }
}

struct Shared {
    state: Mutex<State>,
    device: Arc<dyn RawDevice>,
    device_total: u64,
    device_name: String,
    /// The device's memory facts when the allocator was created (a trace file's header).
    memory_info: MemoryInfo,
}

/// A stream-aware caching allocator. Cheap to clone (clones share one cache); `Send + Sync`.
#[derive(Clone)]
pub struct Allocator {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("device", &self.shared.device_name)
            .finish_non_exhaustive()
    }
}

/// A device allocation that returns to the cache when dropped.
pub struct Allocation {
    allocator: Allocator,
    block: BlockId,
    ptr: u64,
    size: u64,
    block_size: u64,
    stream: StreamId,
    tag: Tag,
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("stream", &self.stream)
            .field("tag", &self.tag)
            .finish()
    }
}

impl Allocation {
    /// Device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes requested (the block may be larger).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes actually set aside: the request rounded up, plus any remainder too small to split
    /// off. This is what the statistics count.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Stream the allocation belongs to.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Accounting tag.
    pub fn tag(&self) -> Tag {
        self.tag
    }

    /// The allocator this allocation came from.
    pub(crate) fn allocator(&self) -> &Allocator {
        &self.allocator
    }

    /// Declares that `stream` uses this memory: on drop the block is not reused until the work
    /// queued on `stream` by then has completed. A stream the device cannot record events on
    /// (an id it did not hand out, or the null stream on the HIP device) is refused here, so
    /// the block cannot end up waiting forever.
    pub fn record_stream(&self, stream: StreamId) -> Result<(), AllocError> {
        self.allocator.record_stream_block(self.block, stream)
    }

    /// Gives up RAII ownership; the address must later go to [`Allocator::raw_free`].
    pub fn into_raw(mut self) -> u64 {
        self.allocator.lock().raw.insert(self.ptr, self.block);
        // The raw map owns the block now; the destructor must not free it.
        self.block = RAW_OWNED;
        self.ptr
    }
}

/// Block id marking an `Allocation` whose block was handed to the raw API.
const RAW_OWNED: BlockId = BlockId::MAX;

impl Drop for Allocation {
    fn drop(&mut self) {
        if self.block != RAW_OWNED {
            self.allocator.free_block(self.block);
        }
    }
}

/// Events recorded by the optional trace, and how many were dropped for lack of room.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TraceLog {
    /// Events, oldest first.
    pub events: Vec<TraceEvent>,
    /// Events overwritten because the ring was full.
    pub dropped: u64,
}

impl Allocator {
    /// Creates an allocator over `device`, reading `HIPDECODE_MEMORY_LIMIT` and
    /// `HIPDECODE_CACHE_LIMIT` unless `config.read_env` is false.
    pub fn new(
        device: Arc<dyn RawDevice>,
        config: AllocatorConfig,
    ) -> Result<Allocator, AllocError> {
        let env = if config.read_env {
            knobs::Env::process()
        } else {
            knobs::Env::default()
        };
        Self::with_env(device, config, &env)
    }

    /// Like [`Allocator::new`], reading the variables from `env`.
    pub fn with_env(
        device: Arc<dyn RawDevice>,
        config: AllocatorConfig,
        env: &knobs::Env,
    ) -> Result<Allocator, AllocError> {
        let info = device.memory_info()?;
        // Percentages mean "of what the GPU can use": the total on discrete cards, the
        // carve-out plus GTT on UMA devices (the carve-out alone can be a few hundred MiB).
        let device_total = info.uma.map_or(info.total, |u| u.carve_out + u.gtt);
        let env_memory = crate::knobs::MEMORY_LIMIT.value(env)?;
        let env_cache = crate::knobs::CACHE_LIMIT.value(env)?;
        let memory_limit = match config.memory_limit.or(env_memory) {
            Some(spec) => spec.resolve(device_total)?,
            None => Some(limits::default_memory_limit(&info)),
        };
        let cache_spec = config.cache_limit.or(env_cache);
        // The API value wins; the variable applies while the field holds its default.
        let hot_window = match crate::knobs::TRIM_WINDOW.value(env)? {
            Some(w) if config.trim_hot_window == DEFAULT_TRIM_HOT_WINDOW => w,
            _ => config.trim_hot_window,
        };
        let cache_limit = match cache_spec {
            Some(spec) => spec.resolve(device_total)?,
            None => Some(limits::DEFAULT_CACHE_LIMIT),
        };
        let trace = config.trace_capacity.map(|capacity| {
            let trace_config = TraceConfig {
                memory_limit,
                cache_limit,
                cache_limit_explicit: cache_spec.is_some(),
                weight_bytes: config.weight_bytes,
                trim_hot_window: hot_window,
            };
            Trace::new(capacity, trace_config)
        });
        let state = State {
            pool: BlockPool::default(),
            counters: Counters::default(),
            raw: AddrMap::with_capacity_and_hasher(1024, Default::default()),
            pending: PendingFrees::default(),
            unreported_failures: Vec::new(),
            captures: Captures::default(),
            trace,
            memory_limit,
            cache_limit,
            cache_limit_explicit: cache_spec.is_some(),
            weight_bytes: config.weight_bytes,
            hot_window,
            arena_bytes: 0,
            mapped: [0; Tag::COUNT],
            roles: StreamRoles::default(),
        };
        let device_name = device.name();
        Ok(Allocator {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                device,
                device_total,
                device_name,
                memory_info: info,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves counters possibly stale but the pool
        // consistent enough to keep serving; poisoning would turn every later drop into a panic.
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn device(&self) -> &dyn RawDevice {
        &*self.shared.device
    }

    /// Allocates at least `bytes` on `stream`, accounted under `tag`.
    pub fn alloc(&self, bytes: u64, stream: StreamId, tag: Tag) -> Result<Allocation, AllocError> {
        let (block, ptr, block_size) = self.alloc_block(bytes, stream, tag, false)?;
        Ok(Allocation {
            allocator: self.clone(),
            block,
            ptr,
            size: bytes,
            block_size,
            stream,
            tag,
        })
    }

    /// Allocates for FFI callers that manage lifetime themselves; free with
    /// [`Allocator::raw_free`]. Raw allocations still live when the last clone of the allocator
    /// is dropped are returned to the device with it.
    pub fn raw_alloc(&self, bytes: u64, stream: StreamId, tag: Tag) -> Result<u64, AllocError> {
        let (_, ptr, _) = self.alloc_block(bytes, stream, tag, true)?;
        Ok(ptr)
    }

    /// Frees an address from [`Allocator::raw_alloc`] or [`Allocation::into_raw`].
    pub fn raw_free(&self, ptr: u64) -> Result<(), AllocError> {
        let mut st = self.lock();
        let block = st.raw.remove(&ptr).ok_or(AllocError::UnknownPointer(ptr))?;
        self.free_locked(&mut st, block);
        Ok(())
    }

    /// `record_stream` for a raw allocation.
    pub fn raw_record_stream(&self, ptr: u64, stream: StreamId) -> Result<(), AllocError> {
        let mut st = self.lock();
        let block = *st.raw.get(&ptr).ok_or(AllocError::UnknownPointer(ptr))?;
        self.add_stream_use(&mut st, block, stream)
    }

    fn record_stream_block(&self, block: BlockId, stream: StreamId) -> Result<(), AllocError> {
        let mut st = self.lock();
        self.add_stream_use(&mut st, block, stream)
    }

    fn add_stream_use(
        &self,
        st: &mut State,
        block: BlockId,
        stream: StreamId,
    ) -> Result<(), AllocError> {
        let seg_stream = st.pool.segment(st.pool.block(block).segment).pool.stream;
        if stream == seg_stream || st.pool.block(block).stream_uses.contains(&stream) {
            return Ok(());
        }
        // Checked now, while the caller can still act on it: at free time an event that cannot
        // be recorded would leave the block stuck.
        self.device().check_event_stream(stream)?;
        st.pool.block_mut(block).stream_uses.push(stream);
        if let Some(t) = &mut st.trace {
            t.record_use(st.pool.block(block).addr, stream);
        }
        Ok(())
    }

    /// The allocation path shared by the RAII and raw APIs; `raw` registers the address for
    /// `raw_free` under the same lock acquisition.
    fn alloc_block(
        &self,
        bytes: u64,
        stream: StreamId,
        tag: Tag,
        raw: bool,
    ) -> Result<(BlockId, u64, u64), AllocError> {
        if bytes == 0 {
            return Err(AllocError::ZeroSize);
        }
        let rounded = round_request(bytes).ok_or(AllocError::TooLarge(bytes))?;
        let kind = kind_of(rounded);
        let mut st = self.lock();
        // Polling events is illegal during capture; pending frees wait for its end.
        if st.pending.has_pollable() && !st.captures.any_active() {
            self.collect_pending(&mut st, false);
        }
        let key = PoolKey {
            owner: st.captures.owner_for(stream),
            stream,
            kind,
        };
        let block = match st.pool.find_free(key, rounded) {
            Some(b) => {
                st.counters.hits += 1;
                b
            }
            None => {
                st.counters.misses += 1;
                self.grow(&mut st, key, rounded, bytes)?
            }
        };
        let st = &mut *st;
        let ptr = st.pool.take(block, rounded, tag);
        let size = st.pool.block(block).size;
        st.counters.on_alloc(tag, size);
        if let Some(t) = &mut st.trace {
            let graph = key.owner != PoolOwner::Default;
            t.record_alloc(ptr, size, bytes, tag, stream, graph);
        }
        if raw {
            st.raw.insert(ptr, block);
        }
        Ok((block, ptr, size))
    }

    /// Obtains a free block for a request that missed the cache: trim, then a new segment;
    /// on failure wait for pending frees, flush the cache, and try once more. During a graph
    /// capture there is no trim, no wait and no flush (all illegal then): a failed device
    /// allocation is reported at once.
    fn grow(
        &self,
        st: &mut State,
        key: PoolKey,
        rounded: u64,
        requested: u64,
    ) -> Result<BlockId, AllocError> {
        let seg = segment_size(rounded).ok_or(AllocError::TooLarge(requested))?;
        // A stream gets its first segment here, so an id the device does not know is refused
        // before any memory is tied to it; cache hits only reach pools made this way.
        self.device().check_stream(key.stream)?;
        let capturing = st.captures.any_active();
        if let (Some(limit), false) = (st.cache_limit, capturing) {
            let window = st.hot_window;
            self.trim_locked(st, limit, Some(window));
        }
        match self.try_device_alloc(st, seg)? {
            Ok(addr) => return Ok(st.pool.add_segment(addr, seg, key)),
            Err(cause) if capturing => return Err(self.oom_error(st, requested, seg, cause)),
            Err(_) => st.counters.oom_retries += 1,
        }
        self.collect_pending(st, true);
        if let Some(b) = st.pool.find_free(key, rounded) {
            return Ok(b);
        }
        self.trim_locked(st, 0, None);
        match self.try_device_alloc(st, seg)? {
            Ok(addr) => Ok(st.pool.add_segment(addr, seg, key)),
            Err(cause) => Err(self.oom_error(st, requested, seg, cause)),
        }
    }

    /// One device allocation attempt, within the memory limit. The outer error is a device
    /// failure other than running out of memory.
    fn try_device_alloc(
        &self,
        st: &mut State,
        bytes: u64,
    ) -> Result<Result<u64, OomCause>, AllocError> {
        if let Some(limit) = st.memory_limit {
            if st.reserved().saturating_add(bytes) > limit {
                return Ok(Err(OomCause::MemoryLimit));
            }
        }
        match self.device().malloc(bytes) {
            Ok(addr) => {
                let reserved = st.reserved() + bytes;
                st.counters.on_reserve(reserved);
                tracing::debug!(
                    "allocator grew by a segment of {}; it holds {} from the device",
                    fmt_bytes(bytes),
                    fmt_bytes(reserved)
                );
                if let Some(t) = &mut st.trace {
                    t.record_device(TraceKind::DeviceAlloc, addr, bytes);
                }
                Ok(Ok(addr))
            }
            Err(DeviceError::OutOfMemory { .. }) => Ok(Err(OomCause::Device)),
            Err(e) => Err(e.into()),
        }
    }

    fn oom_error(&self, st: &State, requested: u64, segment: u64, cause: OomCause) -> AllocError {
        let mut per_tag: Vec<(Tag, u64)> = st
            .counters
            .per_tag
            .iter()
            .zip(Tag::ALL)
            .filter(|(u, _)| u.current > 0)
            .map(|(u, t)| (t, u.current))
            .collect();
        per_tag.sort_by_key(|&(_, bytes)| std::cmp::Reverse(bytes));
        let reserved = st.reserved();
        let active = st.counters.active;
        let cached = reserved - active;
        let capture_active = st.captures.any_active();
        let hint = OomReport::hint_for(cause, requested, &per_tag, cached, capture_active);
        // Not asked during capture: only calls known to be capture-safe are made then.
        let device_free = if capture_active {
            None
        } else {
            self.device().memory_info().ok().map(|i| i.free)
        };
        let report = OomReport {
            requested,
            segment,
            cause,
            active,
            cached,
            reserved,
            limit: st.memory_limit,
            device_free,
            capture_active,
            per_tag,
            hint,
        };
        // The error carries the whole report to the user; the event is for a log that is
        // watched (`-v`, and a server's default level), so a command line does not print the
        // report twice.
        tracing::info!("{report}");
        AllocError::OutOfMemory(Box::new(report))
    }

    fn free_block(&self, block: BlockId) {
        let mut st = self.lock();
        self.free_locked(&mut st, block);
    }

    fn free_locked(&self, st: &mut State, block: BlockId) {
        let (size, tag, sid, has_uses) = {
            let b = st.pool.block(block);
            debug_assert_eq!(b.state, BlockState::Active);
            (b.size, b.tag, b.segment, !b.stream_uses.is_empty())
        };
        st.counters.on_free(tag, size);
        if let Some(t) = &mut st.trace {
            let (addr, stream) = (st.pool.block(block).addr, st.pool.segment(sid).pool.stream);
            t.record_free(addr, size, tag, stream);
        }
        if has_uses {
            st.pool.mark_pending(block);
            if st.captures.any_active() {
                // Recording an event now could land in the capture; wait for its end.
                st.pending.defer_until_capture_end(block);
            } else {
                self.record_pending(st, block);
            }
        } else if let Some(sid) = st.pool.release(block) {
            self.on_segment_idle(st, sid);
        }
    }

    /// Records the events a pending block waits for; a failure leaves it stuck and reported.
    fn record_pending(&self, st: &mut State, block: BlockId) {
        let uses = st.pool.block(block).stream_uses.clone();
        if let Some(stuck) = st.pending.push(self.device(), block, &uses) {
            Self::report_stuck(st, &stuck);
        }
    }

    /// Keeps an event failure for [`Allocator::take_event_failures`]; each is reported once.
    fn report_stuck(st: &mut State, stuck: &StuckFree) {
        let info = snapshot::stuck_block(&st.pool, stuck);
        st.unreported_failures.push(info);
    }

    /// Returns segments of released graph pools to the device as soon as they idle (or, during
    /// a capture, once it ends).
    fn on_segment_idle(&self, st: &mut State, sid: SegmentId) {
        if !st.captures.any_active() && st.captures.is_dead(st.pool.segment(sid).pool.owner) {
            self.release_segment(st, sid);
        }
    }

    fn release_segment(&self, st: &mut State, sid: SegmentId) {
        debug_assert!(
            !st.captures.any_active(),
            "device free during a graph capture"
        );
        let size = st.pool.segment(sid).size;
        let addr = st.pool.remove_segment(sid);
        // SAFETY: the segment came from this device's malloc, is removed from the pool (so it
        // is freed once), and has no busy block: every block was freed by its user and every
        // cross-stream use has completed its recorded events.
        let result = unsafe { self.device().free(addr) };
        // A failed free cannot be retried meaningfully (the driver already rejected this
        // address); it is counted so that it shows in the statistics instead of vanishing.
        if result.is_err() {
            st.counters.device_free_failures += 1;
        }
        st.counters.device_frees += 1;
        if let Some(t) = &mut st.trace {
            t.record_device(TraceKind::DeviceFree, addr, size);
        }
    }

    /// Polls (or with `wait`, waits for) pending frees and releases the completed blocks. An
    /// event failure never escapes: that block becomes stuck and is reported, the others are
    /// released as usual.
    fn collect_pending(&self, st: &mut State, wait: bool) {
        debug_assert!(!st.captures.any_active(), "event calls during a capture");
        let collected = st.pending.collect_done(self.device(), wait);
        for stuck in &collected.stuck {
            Self::report_stuck(st, stuck);
        }
        for block in collected.done {
            if let Some(sid) = st.pool.release(block) {
                self.on_segment_idle(st, sid);
            }
        }
    }

    /// Releases idle ordinary-pool segments, least recently used first, until at most `target`
    /// idle bytes remain. With `spare_window`, segments used within that many allocations are
    /// kept. Returns bytes released.
    fn trim_locked(&self, st: &mut State, target: u64, spare_window: Option<u64>) -> u64 {
        if st.pool.idle_default_bytes() <= target {
            return 0;
        }
        let clock = st.pool.clock();
        let mut released = 0;
        for seg in st.pool.idle_segments() {
            if st.pool.idle_default_bytes() <= target {
                break;
            }
            if seg.owner != PoolOwner::Default {
                continue;
            }
            if spare_window.is_some_and(|w| seg.last_used.saturating_add(w) >= clock) {
                continue;
            }
            self.release_segment(st, seg.id);
            released += seg.size;
        }
        released
    }

    /// Trims to the cache limit unless a capture is active (then the capture's end does it).
    fn trim_to_cache_limit(&self, st: &mut State) -> u64 {
        if st.captures.any_active() {
            return 0;
        }
        let target = st.cache_limit.unwrap_or(u64::MAX);
        self.trim_locked(st, target, None)
    }

    /// Polls pending cross-stream frees; returns how many blocks are still not reusable
    /// (waiting, or stuck after an event failure). During a graph capture nothing is polled.
    pub fn process_pending(&self) -> Result<usize, AllocError> {
        let mut st = self.lock();
        if !st.captures.any_active() {
            self.collect_pending(&mut st, false);
        }
        Ok(st.pending.len())
    }

    /// Releases idle ordinary-pool segments until the cache limit holds. Returns bytes released.
    /// Refused during a graph capture.
    pub fn trim(&self) -> Result<u64, AllocError> {
        let mut st = self.lock();
        Self::refuse_during_capture(&st, "Allocator::trim")?;
        self.collect_pending(&mut st, false);
        Ok(self.trim_to_cache_limit(&mut st))
    }

    /// Releases every idle ordinary-pool segment, waiting for pending frees first. Returns
    /// bytes released. Refused during a graph capture.
    pub fn clear_cache(&self) -> Result<u64, AllocError> {
        let mut st = self.lock();
        Self::refuse_during_capture(&st, "Allocator::clear_cache")?;
        self.collect_pending(&mut st, true);
        Ok(self.trim_locked(&mut st, 0, None))
    }

    fn refuse_during_capture(st: &State, operation: &'static str) -> Result<(), AllocError> {
        if st.captures.any_active() {
            return Err(AllocError::CaptureActive { operation });
        }
        Ok(())
    }

    /// Sets the cache limit (`LimitSpec::FractionOfDevice` resolves against device memory) and
    /// trims to it (during a graph capture: when the capture ends). Traces record it as
    /// explicit.
    pub fn set_cache_limit(&self, spec: LimitSpec) -> Result<(), AllocError> {
        let limit = spec.resolve(self.shared.device_total)?;
        let mut st = self.lock();
        st.cache_limit = limit;
        st.cache_limit_explicit = true;
        self.trim_to_cache_limit(&mut st);
        if let Some(t) = &mut st.trace {
            t.record_limit(TraceKind::CacheLimit(limit));
        }
        Ok(())
    }

    /// Sets the memory limit. Releases idle segments if needed; refuses (keeping the old limit)
    /// when what stays reserved is above the new limit, or when releasing would be needed
    /// during a graph capture.
    pub fn set_memory_limit(&self, spec: LimitSpec) -> Result<(), AllocError> {
        let limit = spec.resolve(self.shared.device_total)?;
        let mut st = self.lock();
        if let Some(l) = limit {
            if st.reserved() > l {
                Self::refuse_during_capture(
                    &st,
                    "lowering the memory limit below what is reserved",
                )?;
                self.collect_pending(&mut st, true);
                let excess = st.reserved() - l;
                let target = st.pool.idle_default_bytes().saturating_sub(excess);
                self.trim_locked(&mut st, target, None);
            }
            if st.reserved() > l {
                return Err(AllocError::LimitBelowReserved {
                    limit: l,
                    reserved: st.reserved(),
                    active: st.counters.active,
                });
            }
        }
        st.memory_limit = limit;
        if let Some(t) = &mut st.trace {
            t.record_limit(TraceKind::MemoryLimit(limit));
        }
        Ok(())
    }

    /// Tells the allocator how many bytes of weights the runtime holds. They are recorded for
    /// traces, replays and reports only: no limit depends on them (the default cache limit is
    /// [`limits::DEFAULT_CACHE_LIMIT`] whatever the model).
    pub fn set_weight_bytes(&self, bytes: u64) {
        let mut st = self.lock();
        st.weight_bytes = bytes;
        if let Some(t) = &mut st.trace {
            t.record_weights(bytes);
        }
    }

    /// The memory limit in force (`None` = unbounded).
    pub fn memory_limit(&self) -> Option<u64> {
        self.lock().memory_limit
    }

    /// The cache limit in force (`None` = unbounded).
    pub fn cache_limit(&self) -> Option<u64> {
        self.lock().cache_limit
    }

    /// Resets every peak to its current value.
    pub fn reset_peak(&self) {
        let mut st = self.lock();
        let reserved = st.reserved();
        st.counters.reset_peak(reserved);
    }

    fn stats_locked(st: &State) -> Stats {
        let c = &st.counters;
        let reserved = st.reserved();
        Stats {
            active_bytes: c.active,
            peak_active_bytes: c.peak_active,
            per_tag: Tag::ALL
                .iter()
                .map(|&t| (t, c.per_tag[t.index()]))
                .collect(),
            reserved_bytes: reserved,
            peak_reserved_bytes: c.peak_reserved,
            cached_bytes: reserved - c.active,
            releasable_bytes: st.pool.idle_default_bytes(),
            pending_free_blocks: st.pending.len() as u64,
            stuck_blocks: st.pending.stuck().len() as u64,
            device_allocs: c.device_allocs,
            device_frees: c.device_frees,
            device_free_failures: c.device_free_failures,
            cache_hits: c.hits,
            cache_misses: c.misses,
            oom_retries: c.oom_retries,
            memory_limit: st.memory_limit,
            cache_limit: st.cache_limit,
            arena_bytes: st.arena_bytes,
            mapped_bytes: st.mapped.iter().sum(),
        }
    }

    /// The device's mapping granularity, where it maps memory piece by piece.
    pub(crate) fn map_granularity(&self) -> Option<u64> {
        self.device().map_granularity()
    }

    /// Reserves `bytes` of address space for a growable region (no memory, nothing booked).
    pub(crate) fn reserve_region(&self, bytes: u64) -> Result<u64, AllocError> {
        Ok(self.device().reserve_addresses(bytes)?)
    }

    /// Maps `bytes` of new memory at `addr` for a growable region of `tag`, within the memory
    /// limit: over it, or with the device out of memory, the cache is released and the map
    /// tried once more before an OOM report. Returns the device's handle.
    pub(crate) fn map_region_piece(
        &self,
        addr: u64,
        bytes: u64,
        tag: Tag,
    ) -> Result<u64, AllocError> {
        let mut st = self.lock();
        // Mapping is not stream-ordered and releasing the cache is illegal during a capture;
        // a region grows between steps, never inside one.
        if st.captures.any_active() {
            return Err(AllocError::CaptureActive {
                operation: "growing a region",
            });
        }
        let mut attempt = 0;
        let handle = loop {
            let cause = match st.memory_limit {
                Some(limit) if st.reserved().saturating_add(bytes) > limit => {
                    Some(OomCause::MemoryLimit)
                }
                _ => None,
            };
            let cause = match cause {
                Some(c) => c,
                // SAFETY: the region reserved this range and maps its pieces in order, each
                // once, so nothing is mapped there yet.
                None => match unsafe { self.device().map(addr, bytes) } {
                    Ok(handle) => break handle,
                    Err(DeviceError::OutOfMemory { .. }) => OomCause::Device,
                    Err(e) => return Err(e.into()),
                },
            };
            if attempt == 1 {
                return Err(self.oom_error(&st, bytes, bytes, cause));
            }
            attempt += 1;
            st.counters.oom_retries += 1;
            self.collect_pending(&mut st, true);
            self.trim_locked(&mut st, 0, None);
        };
        st.mapped[tag.index()] += bytes;
        let reserved = st.reserved();
        st.counters.on_reserve(reserved);
        st.counters.on_alloc(tag, bytes);
        tracing::debug!(
            "a {} region grew by {}; the allocator holds {} from the device",
            tag.name(),
            fmt_bytes(bytes),
            fmt_bytes(reserved)
        );
        Ok(handle)
    }

    /// Unmaps one piece of a growable region of `tag`. A failure is counted, not returned:
    /// this runs in a destructor.
    pub(crate) fn unmap_region_piece(&self, addr: u64, bytes: u64, handle: u64, tag: Tag) {
        let mut st = self.lock();
        // SAFETY: the region hands over exactly one piece it mapped, once, when it is dropped;
        // its owner has finished the work that used it (the same contract as freeing).
        match unsafe { self.device().unmap(addr, bytes, handle) } {
            Ok(()) => st.counters.device_frees += 1,
            Err(e) => {
                st.counters.device_free_failures += 1;
                tracing::warn!("unmapping {} of a region failed: {e}", fmt_bytes(bytes));
            }
        }
        st.mapped[tag.index()] -= bytes;
        st.counters.on_free(tag, bytes);
    }

    /// Waits for the work queued on `stream` so far; `false` if the device could not say
    /// (no event can be recorded there, or waiting failed) or a capture is active.
    pub(crate) fn wait_for_stream(&self, stream: StreamId) -> bool {
        if self.lock().captures.any_active() {
            return false;
        }
        let device = self.device();
        match device.record_event(stream) {
            Ok(event) => {
                let waited = device.event_wait(event).is_ok();
                device.destroy_event(event);
                waited
            }
            Err(_) => false,
        }
    }

    /// Returns a growable region's address space once every piece is unmapped.
    pub(crate) fn release_region(&self, addr: u64, bytes: u64) {
        // SAFETY: the region's pieces were all unmapped just before, and it is being dropped.
        if let Err(e) = unsafe { self.device().free_addresses(addr, bytes) } {
            self.lock().counters.device_free_failures += 1;
            tracing::warn!("returning a region's addresses failed: {e}");
        }
    }

    /// A consistent copy of the counters.
    pub fn stats(&self) -> Stats {
        Self::stats_locked(&self.lock())
    }

    /// Every segment and block, with the counters, at one moment.
    pub fn snapshot(&self) -> Snapshot {
        let st = self.lock();
        Snapshot {
            device: self.shared.device_name.clone(),
            stats: Self::stats_locked(&st),
            segments: snapshot::segments(&st.pool),
            mapped_by_tag: Tag::ALL
                .iter()
                .map(|&t| (t, st.mapped[t.index()]))
                .collect(),
            main_stream: st.roles.main,
            stranded: snapshot::stranded(&st.pool, &st.roles),
            stuck_blocks: st
                .pending
                .stuck()
                .iter()
                .map(|s| snapshot::stuck_block(&st.pool, s))
                .collect(),
        }
    }

    /// Event failures since the last call, each reported once: the block (kept out of reuse
    /// for good, see [`Snapshot::stuck_blocks`]) and the stream whose event call failed.
    pub fn take_event_failures(&self) -> Vec<StuckBlock> {
        std::mem::take(&mut self.lock().unreported_failures)
    }

    /// Starts recording up to `capacity` most recent events (replacing any current trace).
    /// Allocations live at this moment become the trace's first events (at time 0, with their
    /// block size as the request), so that their frees match; enable tracing through
    /// [`AllocatorConfig::trace_capacity`] to record from the very first allocation.
    pub fn enable_trace(&self, capacity: usize) {
        let mut st = self.lock();
        let mut live = Vec::new();
        for (sid, blocks) in st.pool.walk() {
            let stream = st.pool.segment(sid).pool.stream;
            for bid in blocks {
                let b = st.pool.block(bid);
                if b.state == BlockState::Active {
                    live.push(LiveBlock {
                        addr: b.addr,
                        size: b.size,
                        tag: b.tag,
                        stream,
                    });
                }
            }
        }
        let config = Self::trace_config(&st);
        st.trace = Some(Trace::with_live(capacity, config, live));
    }

    fn trace_config(st: &State) -> TraceConfig {
        TraceConfig {
            memory_limit: st.memory_limit,
            cache_limit: st.cache_limit,
            cache_limit_explicit: st.cache_limit_explicit,
            weight_bytes: st.weight_bytes,
            trim_hot_window: st.hot_window,
        }
    }

    /// The trace so far as a file (header and events), leaving the trace running and its
    /// events in place; `None` when tracing is off. The header says whether the trace is
    /// complete (no event dropped by a full ring or taken out by [`Allocator::take_trace`]).
    pub fn trace_file(&self) -> Option<TraceFile> {
        let st = self.lock();
        let trace = st.trace.as_ref()?;
        let info = &self.shared.memory_info;
        let device = TraceDevice {
            name: self.shared.device_name.clone(),
            total: info.total,
            usable: self.shared.device_total,
            uma: info.uma.map(Into::into),
        };
        let c = &st.counters;
        let recorded = RecordedCounters {
            // Growable regions are not traced (`replay` simulates the pools only).
            reserved_bytes: st.pool.reserved(),
            active_bytes: c.active,
            peak_reserved_bytes: c.peak_reserved,
            peak_active_bytes: c.peak_active,
            device_allocs: c.device_allocs,
            device_frees: c.device_frees,
        };
        Some(trace.to_file(device, recorded))
    }

    /// Writes the trace so far in the trace file format (`docs/memory.md`, "Replaying a trace
    /// on another machine's memory") and returns what was written. Tracing continues.
    pub fn write_trace(&self, w: &mut dyn std::io::Write) -> Result<TraceFile, TraceError> {
        let file = self.trace_file().ok_or(TraceError::NotTracing)?;
        file.write_to(w)?;
        Ok(file)
    }

    /// [`Allocator::write_trace`] to a file at `path` (created or truncated).
    pub fn write_trace_file(&self, path: &std::path::Path) -> Result<TraceFile, TraceError> {
        let file = self.trace_file().ok_or(TraceError::NotTracing)?;
        file.write_path(path)?;
        Ok(file)
    }

    /// Stops tracing and returns what was recorded.
    pub fn disable_trace(&self) -> TraceLog {
        let t = self.lock().trace.take();
        t.map_or(
            TraceLog {
                events: Vec::new(),
                dropped: 0,
            },
            |mut t| {
                let (events, dropped) = t.take();
                TraceLog { events, dropped }
            },
        )
    }

    /// Returns and clears what the trace recorded so far; tracing continues.
    pub fn take_trace(&self) -> TraceLog {
        let mut st = self.lock();
        match &mut st.trace {
            Some(t) => {
                let (events, dropped) = t.take();
                TraceLog { events, dropped }
            }
            None => TraceLog {
                events: Vec::new(),
                dropped: 0,
            },
        }
    }

    /// Opens a graph pool's account; [`Allocator::release_graph_pool`] closes it.
    pub(crate) fn register_graph_pool(&self) -> GraphPoolId {
        self.lock().captures.new_pool()
    }

    /// Starts routing allocations on `stream` to `owner`'s pool, unless `stream` is unknown or
    /// already capturing; [`Allocator::end_capture`] stops it.
    pub(crate) fn register_capture(
        &self,
        stream: StreamId,
        owner: PoolOwner,
    ) -> Result<(), AllocError> {
        self.device().check_stream(stream)?;
        let mut st = self.lock();
        if st.captures.is_capturing(stream) {
            return Err(AllocError::AlreadyCapturing(stream));
        }
        st.captures.begin(stream, owner);
        Ok(())
    }

    pub(crate) fn end_capture(&self, stream: StreamId) {
        let mut st = self.lock();
        if st.captures.end(stream) {
            self.after_last_capture(&mut st);
        }
    }

    /// Does what the captures held back: records the events of blocks freed meanwhile,
    /// returns idle segments of dropped graph pools, and trims to the cache limit.
    fn after_last_capture(&self, st: &mut State) {
        for block in st.pending.take_awaiting_capture_end() {
            self.record_pending(st, block);
        }
        for seg in st.pool.idle_segments() {
            if st.captures.is_dead(seg.owner) {
                self.release_segment(st, seg.id);
            }
        }
        self.trim_to_cache_limit(st);
    }

    pub(crate) fn release_graph_pool(&self, id: GraphPoolId) {
        let mut st = self.lock();
        st.captures.release_pool(id);
        if st.captures.any_active() {
            // Freed when the last capture ends.
            return;
        }
        for seg in st.pool.idle_segments() {
            if seg.owner == PoolOwner::Graph(id) {
                self.release_segment(&mut st, seg.id);
            }
        }
    }

    /// Counts a new decode arena's backing block in the arena bytes.
    pub(crate) fn arena_created(&self, block_size: u64) {
        self.lock().arena_bytes += block_size;
    }

    /// Called by a dropped [`crate::DecodeArena`] before its backing allocation is freed.
    pub(crate) fn arena_dropped(&self, block_size: u64) {
        let mut st = self.lock();
        st.arena_bytes = st.arena_bytes.saturating_sub(block_size);
    }

    /// Names the stream most work runs on. The snapshot then lists free and pending blocks
    /// cached on any other stream as stranded: only that stream can reuse them.
    pub fn set_main_stream(&self, stream: StreamId) {
        self.lock().roles.main = Some(stream);
    }

    /// Declares that nothing will run on `stream` any more (a side stream whose work is done).
    /// Every block still in its pools, whatever its state, is then listed as stranded in the
    /// snapshot with its size and stream, instead of being found at an OOM.
    pub fn retire_stream(&self, stream: StreamId) {
        let mut st = self.lock();
        if !st.roles.retired.contains(&stream) {
            st.roles.retired.push(stream);
        }
    }

    /// Backend name.
    pub fn device_name(&self) -> &str {
        &self.shared.device_name
    }

    /// Memory the GPU can use, as reported when the allocator was created (total on discrete
    /// cards, carve-out plus GTT on UMA devices): what percentages resolve against.
    pub fn device_total(&self) -> u64 {
        self.shared.device_total
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let device = &*self.device;
        // Other streams may still read pending blocks: wait for them before freeing anything.
        // (No capture can be active: every CaptureGuard holds a clone of the allocator.)
        st.pending.collect_done(device, true);
        st.pending.destroy_all(device);
        // Every Allocation and GraphPool holds a clone, so only raw allocations can still be
        // live here; their memory goes with the allocator, as documented on `raw_alloc`.
        for (sid, _) in st.pool.walk() {
            let addr = st.pool.segment(sid).addr;
            // SAFETY: each live segment came from this device's malloc and is freed exactly
            // once, here, as the allocator is destroyed.
            let _ = unsafe { device.free(addr) };
        }
    }
}
