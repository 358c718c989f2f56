//! A simulated device for tests, benchmarks and what-if studies.
//!
//! It has a capacity (optionally a UMA layout of carve-out, GTT and host RAM), hands out
//! non-overlapping fake addresses without backing memory, charges a configurable cost per raw
//! allocation to a simulated clock (never sleeping), injects allocation and event failures on
//! demand, and models streams whose recorded events complete only when the test says so.
//!
//! It also checks graph-capture legality: between [`SimDevice::begin_capture`] and
//! [`SimDevice::end_capture`] the calls a real driver forbids while a stream captures (freeing
//! device memory, recording, querying or waiting on events) fail and are logged as violations
//! ([`SimDevice::capture_violations`]), as they would break a real capture.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use crate::device::{DeviceError, EventId, MemoryInfo, RawDevice, StreamId, UmaInfo};
use crate::limits;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Cost of one raw allocation or free: `base_ns + bytes * per_gib_ns / 2^30`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CostModel {
    /// Fixed cost per call.
    pub base_ns: u64,
    /// Additional cost per GiB.
    pub per_gib_ns: u64,
}

impl CostModel {
    /// Free calls.
    pub const FREE: CostModel = CostModel {
        base_ns: 0,
        per_gib_ns: 0,
    };
    /// hipMalloc/hipFree as measured on the H200 host: about 94 µs per call, about 1 ms at 1 GiB.
    pub const H200: CostModel = CostModel {
        base_ns: 94_000,
        per_gib_ns: 906_000,
    };

    /// Simulated cost of a call for `bytes`.
    pub fn cost(&self, bytes: u64) -> u64 {
        self.base_ns + ((bytes as u128 * self.per_gib_ns as u128) >> 30) as u64
    }
}

/// The mapping granularity of a simulated device: 2 MiB, what CUDA reports on discrete cards.
pub const SIM_MAP_GRANULARITY: u64 = 2 << 20;

/// Configuration of a [`SimDevice`].
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Device memory (on UMA: ignored in favour of carve-out + GTT).
    pub capacity: u64,
    /// UMA layout, making the device integrated.
    pub uma: Option<UmaInfo>,
    /// Cost of raw calls.
    pub cost: CostModel,
    /// When true, events complete as soon as they are recorded (streams are always idle).
    pub events_complete_immediately: bool,
    /// The size memory is mapped in, if the device maps memory into reserved address ranges
    /// (as HIP and CUDA devices with virtual memory management do); `None`: it cannot.
    pub map_granularity: Option<u64>,
}

impl SimConfig {
    /// A discrete device of `capacity` bytes with free raw calls and manual events.
    pub fn discrete(capacity: u64) -> SimConfig {
        SimConfig {
            capacity,
            uma: None,
            map_granularity: Some(SIM_MAP_GRANULARITY),
            cost: CostModel::FREE,
            events_complete_immediately: false,
        }
    }

    /// An integrated device.
    pub fn uma(uma: UmaInfo) -> SimConfig {
        SimConfig {
            capacity: uma.carve_out + uma.gtt,
            uma: Some(uma),
            map_granularity: Some(SIM_MAP_GRANULARITY),
            cost: CostModel::FREE,
            events_complete_immediately: false,
        }
    }

    /// Strix Halo (gfx1151) with the firmware's 96 GiB carve-out: of 128 GiB of LPDDR5X the
    /// OS keeps 32 GiB, and GTT is the Linux default of half the OS's RAM, 16 GiB.
    pub fn gfx1151() -> SimConfig {
        SimConfig::uma(UmaInfo {
            carve_out: 96 * GIB,
            gtt: 16 * GIB,
            host_ram: 32 * GIB,
        })
    }

    /// Strix Halo (gfx1151) with a 512 MiB carve-out and GTT raised to 120 GiB (the
    /// `amdgpu.gttsize` / `ttm.pages_limit` setup used for large models): the GPU's memory is
    /// almost all host RAM, so the OS's reserve is what can run out.
    pub fn gfx1151_gtt() -> SimConfig {
        SimConfig::uma(UmaInfo {
            carve_out: 512 * MIB,
            gtt: 120 * GIB,
            host_ram: 128 * GIB - 512 * MIB,
        })
    }

    /// A 16 GiB discrete card (Radeon RX 9060 XT 16 GB, gfx1200).
    pub fn discrete_16g() -> SimConfig {
        SimConfig::discrete(16 * GIB)
    }

    /// On a UMA device, the host RAM the OS keeps for itself, this process and the page cache
    /// ([`limits::uma_host_reserve`], the reserve the default memory limit leaves).
    pub fn host_reserve(&self) -> Option<u64> {
        self.uma.map(|u| limits::uma_host_reserve(u.host_ram))
    }

    /// On a UMA device, the GTT bytes the GPU can take while the OS keeps its reserve: host
    /// RAM minus [`SimConfig::host_reserve`]. GTT pages are host RAM taken on demand, so going
    /// past this does not fail an allocation; it starves the OS (swap, then the OOM killer).
    pub fn gtt_budget(&self) -> Option<u64> {
        self.uma.map(|u| {
            u.host_ram
                .saturating_sub(limits::uma_host_reserve(u.host_ram))
        })
    }

    /// GTT bytes in use when the device holds `used` bytes: allocations fill the carve-out
    /// first, then GTT. 0 on a discrete device.
    pub fn gtt_used(&self, used: u64) -> u64 {
        self.uma.map_or(0, |u| used.saturating_sub(u.carve_out))
    }
}

/// A named device to simulate: what a trace is replayed on (`cargo xtask replay --profile`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceProfile {
    /// [`SimConfig::gfx1151`]: Strix Halo, 96 GiB carve-out.
    Gfx1151,
    /// [`SimConfig::gfx1151_gtt`]: Strix Halo, 512 MiB carve-out, 120 GiB GTT.
    Gfx1151Gtt,
    /// [`SimConfig::discrete_16g`]: a 16 GiB discrete card.
    Discrete16g,
}

impl DeviceProfile {
    /// Every profile, in the order help texts list them.
    pub const ALL: [DeviceProfile; 3] = [
        DeviceProfile::Gfx1151,
        DeviceProfile::Gfx1151Gtt,
        DeviceProfile::Discrete16g,
    ];

    /// The name `FromStr` accepts.
    pub fn name(self) -> &'static str {
        match self {
            DeviceProfile::Gfx1151 => "gfx1151",
            DeviceProfile::Gfx1151Gtt => "gfx1151-gtt",
            DeviceProfile::Discrete16g => "discrete-16g",
        }
    }

    /// One line for reports.
    pub fn description(self) -> &'static str {
        match self {
            DeviceProfile::Gfx1151 => {
                "Strix Halo APU (gfx1151), 128 GiB: 96 GiB carve-out, 16 GiB GTT, 32 GiB for the OS"
            }
            DeviceProfile::Gfx1151Gtt => {
                "Strix Halo APU (gfx1151), 128 GiB: 512 MiB carve-out, 120 GiB GTT, 127.5 GiB for the OS"
            }
            DeviceProfile::Discrete16g => "16 GiB discrete card (Radeon RX 9060 XT 16 GB, gfx1200)",
        }
    }

    /// The simulated device's configuration.
    pub fn config(self) -> SimConfig {
        match self {
            DeviceProfile::Gfx1151 => SimConfig::gfx1151(),
            DeviceProfile::Gfx1151Gtt => SimConfig::gfx1151_gtt(),
            DeviceProfile::Discrete16g => SimConfig::discrete_16g(),
        }
    }
}

impl std::fmt::Display for DeviceProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A profile name [`DeviceProfile`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown device profile {name:?}; known profiles: {}",
    known_profiles()
)]
pub struct UnknownProfile {
    /// The name given.
    pub name: String,
}

fn known_profiles() -> String {
    DeviceProfile::ALL
        .iter()
        .map(|p| format!("{} ({})", p.name(), p.description()))
        .collect::<Vec<_>>()
        .join(", ")
}

impl std::str::FromStr for DeviceProfile {
    type Err = UnknownProfile;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase();
        DeviceProfile::ALL
            .into_iter()
            .find(|p| p.name() == wanted)
            .ok_or_else(|| UnknownProfile {
                name: s.to_string(),
            })
    }
}

/// Counters of a [`SimDevice`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Successful raw allocations.
    pub mallocs: u64,
    /// Raw frees.
    pub frees: u64,
    /// Raw allocations refused (capacity or injected).
    pub failed_mallocs: u64,
    /// Bytes currently allocated.
    pub used: u64,
    /// Highest `used` so far.
    pub peak_used: u64,
    /// Live raw allocations.
    pub live: u64,
    /// Simulated nanoseconds spent in raw calls.
    pub simulated_ns: u64,
    /// Events recorded and not yet destroyed.
    pub live_events: u64,
    /// Bytes mapped into reserved address ranges (a part of `used`).
    pub mapped: u64,
    /// Live address reservations.
    pub reservations: u64,
}

/// Which event calls fail on a stream (fault injection).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventFaults {
    /// `record_event` on the stream fails.
    pub record: bool,
    /// `event_complete` on events recorded on the stream fails.
    pub query: bool,
    /// `event_wait` on events recorded on the stream fails.
    pub wait: bool,
}

#[derive(Default)]
struct SimState {
    live: HashMap<u64, u64>,
    /// Address reservations: start -> bytes.
    reservations: HashMap<u64, u64>,
    /// Mapped pieces: handle -> (address, bytes).
    mappings: HashMap<u64, (u64, u64)>,
    next_handle: u64,
    next_addr: u64,
    fail_next: u64,
    fail_above: Option<u64>,
    /// stream -> (last submitted work id, last completed work id)
    streams: HashMap<StreamId, (u64, u64)>,
    /// Streams handed out by `create_stream` (the default stream is always known).
    created: HashSet<StreamId>,
    events: HashMap<u64, (StreamId, u64)>,
    next_event: u64,
    event_faults: HashMap<StreamId, EventFaults>,
    /// Streams marked as capturing; while non-empty, capture-illegal calls are violations.
    capturing: Vec<StreamId>,
    violations: Vec<String>,
    stats: SimStats,
}

impl SimState {
    /// Logs and refuses a call that a real driver forbids during capture.
    fn refuse_if_capturing(&mut self, call: &'static str) -> Result<(), DeviceError> {
        if self.capturing.is_empty() {
            return Ok(());
        }
        self.violations
            .push(format!("{call} while {:?} captured", self.capturing));
        Err(DeviceError::Driver {
            call,
            message: "operation not permitted when stream is capturing".into(),
        })
    }
}

/// The simulated device.
pub struct SimDevice {
    config: SimConfig,
    state: Mutex<SimState>,
}

const ADDR_BASE: u64 = 0x7f00_0000_0000;
const ADDR_ALIGN: u64 = 2 << 20;

impl SimDevice {
    /// Creates a device.
    pub fn new(config: SimConfig) -> SimDevice {
        SimDevice {
            config,
            state: Mutex::new(SimState {
                next_addr: ADDR_BASE,
                ..Default::default()
            }),
        }
    }

    /// A discrete device of `capacity` bytes.
    pub fn discrete(capacity: u64) -> SimDevice {
        SimDevice::new(SimConfig::discrete(capacity))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn capacity(&self) -> u64 {
        match self.config.uma {
            Some(u) => u.carve_out + u.gtt,
            None => self.config.capacity,
        }
    }

    /// The granularity, after checking that `bytes` is a whole number of pieces of it.
    fn granular(&self, call: &'static str, bytes: u64) -> Result<u64, DeviceError> {
        match self.config.map_granularity {
            Some(g) if bytes > 0 && bytes.is_multiple_of(g) => Ok(g),
            Some(g) => Err(DeviceError::Driver {
                call,
                message: format!("{bytes} bytes is not a whole number of {g}-byte pieces"),
            }),
            None => Err(DeviceError::Driver {
                call,
                message: "this simulated device maps no memory piece by piece".into(),
            }),
        }
    }

    /// Makes the next `n` raw allocations fail with out-of-memory.
    pub fn fail_next_mallocs(&self, n: u64) {
        self.lock().fail_next = n;
    }

    /// Makes every raw allocation above `bytes` fail (`None` turns this off).
    pub fn fail_mallocs_above(&self, bytes: Option<u64>) {
        self.lock().fail_above = bytes;
    }

    /// A new stream of this device.
    pub fn create_stream(&self) -> StreamId {
        let mut st = self.lock();
        let id = StreamId::fresh();
        st.created.insert(id);
        st.streams.insert(id, (0, 0));
        id
    }

    /// Makes the chosen event calls on `stream` fail until changed (all `false` turns it off).
    pub fn set_event_faults(&self, stream: StreamId, faults: EventFaults) {
        self.lock().event_faults.insert(stream, faults);
    }

    /// Marks `stream` as capturing a graph, as the driver would after `hipStreamBeginCapture`.
    pub fn begin_capture(&self, stream: StreamId) {
        self.lock().capturing.push(stream);
    }

    /// Ends the capture on `stream`.
    pub fn end_capture(&self, stream: StreamId) {
        self.lock().capturing.retain(|&s| s != stream);
    }

    /// Capture-illegal calls made so far (each refused with an error when it happened).
    pub fn capture_violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    /// Queues work on `stream` (for example a kernel reading a buffer). Events recorded after
    /// this complete only once the work completes.
    pub fn submit_work(&self, stream: StreamId) {
        let mut st = self.lock();
        let e = st.streams.entry(stream).or_default();
        e.0 += 1;
    }

    /// Completes all work queued on `stream` so far.
    pub fn complete_stream(&self, stream: StreamId) {
        let mut st = self.lock();
        let e = st.streams.entry(stream).or_default();
        e.1 = e.0;
    }

    /// Work items `stream` has completed so far: they complete through `complete_stream`,
    /// `complete_all`, or an event wait, which lets the stream run up to the event.
    pub fn completed_work(&self, stream: StreamId) -> u64 {
        self.lock().streams.get(&stream).map_or(0, |s| s.1)
    }

    /// Completes all work on every stream.
    pub fn complete_all(&self) {
        let mut st = self.lock();
        for e in st.streams.values_mut() {
            e.1 = e.0;
        }
    }

    /// Counters.
    pub fn stats(&self) -> SimStats {
        let st = self.lock();
        let mut s = st.stats;
        s.live = st.live.len() as u64;
        s.live_events = st.events.len() as u64;
        s.reservations = st.reservations.len() as u64;
        s
    }

    /// Live raw allocations as (address, size), sorted by address.
    pub fn live_allocations(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self.lock().live.iter().map(|(&a, &s)| (a, s)).collect();
        v.sort_unstable();
        v
    }
}

impl RawDevice for SimDevice {
    fn name(&self) -> String {
        match self.config.uma {
            Some(_) => format!("sim-uma({} bytes)", self.capacity()),
            None => format!("sim({} bytes)", self.capacity()),
        }
    }

    fn malloc(&self, bytes: u64) -> Result<u64, DeviceError> {
        let cap = self.capacity();
        let mut st = self.lock();
        st.stats.simulated_ns += self.config.cost.cost(bytes);
        let injected = if st.fail_next > 0 {
            st.fail_next -= 1;
            true
        } else {
            st.fail_above.is_some_and(|limit| bytes > limit)
        };
        if injected || st.stats.used.saturating_add(bytes) > cap {
            st.stats.failed_mallocs += 1;
            return Err(DeviceError::OutOfMemory { bytes });
        }
        let addr = st.next_addr;
        // Leave a gap so that adjacent segments never look contiguous.
        st.next_addr += bytes.next_multiple_of(ADDR_ALIGN) + ADDR_ALIGN;
        st.live.insert(addr, bytes);
        st.stats.used += bytes;
        st.stats.peak_used = st.stats.peak_used.max(st.stats.used);
        st.stats.mallocs += 1;
        Ok(addr)
    }

    unsafe fn free(&self, ptr: u64) -> Result<(), DeviceError> {
        let mut st = self.lock();
        st.refuse_if_capturing("sim free")?;
        let Some(bytes) = st.live.remove(&ptr) else {
            return Err(DeviceError::Driver {
                call: "sim free",
                message: format!("{ptr:#x} is not allocated"),
            });
        };
        st.stats.simulated_ns += self.config.cost.cost(bytes);
        st.stats.used -= bytes;
        st.stats.frees += 1;
        Ok(())
    }

    fn check_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        let st = self.lock();
        if stream == StreamId::DEFAULT || st.created.contains(&stream) {
            Ok(())
        } else {
            Err(DeviceError::UnknownStream {
                stream,
                purpose: "allocation",
                reason: "SimDevice::create_stream did not hand it out".into(),
            })
        }
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError> {
        self.check_event_stream(stream)?;
        let mut st = self.lock();
        st.refuse_if_capturing("sim record_event")?;
        if st.event_faults.get(&stream).is_some_and(|f| f.record) {
            return Err(DeviceError::Driver {
                call: "sim record_event",
                message: format!("injected failure on {stream:?}"),
            });
        }
        let target = if self.config.events_complete_immediately {
            0
        } else {
            st.streams.entry(stream).or_default().0
        };
        st.next_event += 1;
        let id = st.next_event;
        st.events.insert(id, (stream, target));
        Ok(EventId(id))
    }

    fn event_complete(&self, event: EventId) -> Result<bool, DeviceError> {
        let mut st = self.lock();
        st.refuse_if_capturing("sim event query")?;
        let &(stream, target) = st.events.get(&event.0).ok_or_else(|| DeviceError::Driver {
            call: "sim event query",
            message: "unknown event".into(),
        })?;
        if st.event_faults.get(&stream).is_some_and(|f| f.query) {
            return Err(DeviceError::Driver {
                call: "sim event query",
                message: format!("injected failure on {stream:?}"),
            });
        }
        Ok(st.streams.get(&stream).map_or(0, |s| s.1) >= target)
    }

    fn event_wait(&self, event: EventId) -> Result<(), DeviceError> {
        let mut st = self.lock();
        st.refuse_if_capturing("sim event wait")?;
        let &(stream, target) = st.events.get(&event.0).ok_or_else(|| DeviceError::Driver {
            call: "sim event wait",
            message: "unknown event".into(),
        })?;
        if st.event_faults.get(&stream).is_some_and(|f| f.wait) {
            return Err(DeviceError::Driver {
                call: "sim event wait",
                message: format!("injected failure on {stream:?}"),
            });
        }
        // Waiting lets the stream run up to the event.
        let s = st.streams.entry(stream).or_default();
        s.1 = s.1.max(target);
        Ok(())
    }

    fn destroy_event(&self, event: EventId) {
        self.lock().events.remove(&event.0);
    }

    fn map_granularity(&self) -> Option<u64> {
        self.config.map_granularity
    }

    fn reserve_addresses(&self, bytes: u64) -> Result<u64, DeviceError> {
        let granularity = self.granular("sim reserve_addresses", bytes)?;
        let mut st = self.lock();
        let addr = st.next_addr.next_multiple_of(granularity);
        st.next_addr = addr + bytes + ADDR_ALIGN;
        st.reservations.insert(addr, bytes);
        Ok(addr)
    }

    unsafe fn free_addresses(&self, addr: u64, bytes: u64) -> Result<(), DeviceError> {
        let mut st = self.lock();
        if st.reservations.get(&addr) != Some(&bytes) {
            return Err(DeviceError::Driver {
                call: "sim free_addresses",
                message: format!("{addr:#x} is not a reservation of {bytes} bytes"),
            });
        }
        let end = addr + bytes;
        if st.mappings.values().any(|&(a, _)| a >= addr && a < end) {
            return Err(DeviceError::Driver {
                call: "sim free_addresses",
                message: format!("the reservation at {addr:#x} still has memory mapped"),
            });
        }
        st.reservations.remove(&addr);
        Ok(())
    }

    unsafe fn map(&self, addr: u64, bytes: u64) -> Result<u64, DeviceError> {
        self.granular("sim map", bytes)?;
        let cap = self.capacity();
        let mut st = self.lock();
        st.refuse_if_capturing("sim map")?;
        let inside = st
            .reservations
            .iter()
            .any(|(&start, &len)| addr >= start && addr + bytes <= start + len);
        let overlaps = st
            .mappings
            .values()
            .any(|&(a, n)| addr < a + n && a < addr + bytes);
        if !inside || overlaps {
            return Err(DeviceError::Driver {
                call: "sim map",
                message: format!(
                    "[{addr:#x}, +{bytes}) is not free address space inside one reservation"
                ),
            });
        }
        st.stats.simulated_ns += self.config.cost.cost(bytes);
        let injected = if st.fail_next > 0 {
            st.fail_next -= 1;
            true
        } else {
            false
        };
        if injected || st.stats.used.saturating_add(bytes) > cap {
            st.stats.failed_mallocs += 1;
            return Err(DeviceError::OutOfMemory { bytes });
        }
        st.next_handle += 1;
        let handle = st.next_handle;
        st.mappings.insert(handle, (addr, bytes));
        st.stats.used += bytes;
        st.stats.mapped += bytes;
        st.stats.peak_used = st.stats.peak_used.max(st.stats.used);
        Ok(handle)
    }

    unsafe fn unmap(&self, addr: u64, bytes: u64, handle: u64) -> Result<(), DeviceError> {
        let mut st = self.lock();
        st.refuse_if_capturing("sim unmap")?;
        if st.mappings.get(&handle) != Some(&(addr, bytes)) {
            return Err(DeviceError::Driver {
                call: "sim unmap",
                message: format!("handle {handle} does not map [{addr:#x}, +{bytes})"),
            });
        }
        st.mappings.remove(&handle);
        st.stats.simulated_ns += self.config.cost.cost(bytes);
        st.stats.used -= bytes;
        st.stats.mapped -= bytes;
        Ok(())
    }

    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        let st = self.lock();
        let total = self
            .config
            .uma
            .map_or(self.config.capacity, |u| u.carve_out);
        Ok(MemoryInfo {
            free: self.capacity().saturating_sub(st.stats.used),
            total,
            uma: self.config.uma,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_and_fault_injection() {
        let d = SimDevice::discrete(8 << 20);
        let a = d.malloc(4 << 20).unwrap();
        assert!(matches!(
            d.malloc(6 << 20),
            Err(DeviceError::OutOfMemory { .. })
        ));
        d.fail_next_mallocs(1);
        assert!(d.malloc(1 << 20).is_err());
        let b = d.malloc(1 << 20).unwrap();
        assert!(b >= a + (4 << 20), "addresses never overlap");
        // SAFETY: both addresses came from this device's malloc and are freed once.
        unsafe {
            d.free(a).unwrap();
            d.free(b).unwrap();
            assert!(d.free(b).is_err());
        }
        assert_eq!(d.stats().used, 0);
        assert_eq!(d.stats().failed_mallocs, 2);
    }

    #[test]
    fn events_follow_stream_work() {
        let d = SimDevice::discrete(1 << 30);
        let s = d.create_stream();
        let idle = d.record_event(s).unwrap();
        assert!(
            d.event_complete(idle).unwrap(),
            "no work queued: complete at once"
        );
        d.submit_work(s);
        let e = d.record_event(s).unwrap();
        assert!(!d.event_complete(e).unwrap());
        d.complete_stream(s);
        assert!(d.event_complete(e).unwrap());
        d.submit_work(s);
        let w = d.record_event(s).unwrap();
        d.event_wait(w).unwrap();
        assert!(d.event_complete(w).unwrap());
    }

    #[test]
    fn unknown_streams_are_refused() {
        let d = SimDevice::discrete(1 << 30);
        let other = SimDevice::discrete(1 << 30);
        let foreign = other.create_stream();
        let mine = d.create_stream();
        assert!(d.check_stream(StreamId::DEFAULT).is_ok());
        assert!(d.check_stream(mine).is_ok());
        let e = d.check_stream(foreign).unwrap_err();
        assert!(
            matches!(e, DeviceError::UnknownStream { stream, .. } if stream == foreign),
            "{e}"
        );
        assert!(d.record_event(foreign).is_err());
    }

    #[test]
    fn capture_checker_refuses_and_logs_illegal_calls() {
        let d = SimDevice::discrete(1 << 30);
        let s = d.create_stream();
        let a = d.malloc(1 << 20).unwrap();
        let e = d.record_event(s).unwrap();
        d.begin_capture(s);
        assert!(d.malloc(1 << 20).is_ok(), "malloc is legal during capture");
        // SAFETY: `a` came from this device's malloc; the refused free leaves it allocated.
        assert!(unsafe { d.free(a) }.is_err());
        assert!(d.record_event(s).is_err());
        assert!(d.event_complete(e).is_err());
        assert!(d.event_wait(e).is_err());
        assert_eq!(d.capture_violations().len(), 4);
        d.end_capture(s);
        // SAFETY: as above; it is still allocated because the refused free did nothing.
        assert!(unsafe { d.free(a) }.is_ok());
        assert!(d.event_complete(e).unwrap());
        assert_eq!(d.capture_violations().len(), 4);
    }

    #[test]
    fn profiles_parse_and_model_the_os_reserve() {
        for p in DeviceProfile::ALL {
            assert_eq!(p.name().parse::<DeviceProfile>(), Ok(p));
        }
        assert_eq!("GFX1151".parse(), Ok(DeviceProfile::Gfx1151));
        let e = "gfx1100".parse::<DeviceProfile>().unwrap_err().to_string();
        assert!(e.contains("\"gfx1100\""), "{e}");
        for p in DeviceProfile::ALL {
            assert!(e.contains(p.name()), "{e}");
        }
        // 96 GiB carve-out: the OS has 32 GiB and keeps 8 GiB, more than GTT can take.
        let apu = SimConfig::gfx1151();
        assert_eq!(apu.host_reserve(), Some(8 * GIB));
        assert_eq!(apu.gtt_budget(), Some(24 * GIB));
        assert_eq!(apu.gtt_used(100 * GIB), 4 * GIB);
        // Small carve-out, large GTT: GTT can eat into the OS's reserve.
        let gtt = SimConfig::gfx1151_gtt();
        let budget = gtt.gtt_budget().unwrap();
        assert!(budget < gtt.uma.unwrap().gtt, "{budget}");
        assert_eq!(SimConfig::discrete_16g().gtt_budget(), None);
        let d = SimDevice::new(SimConfig::discrete_16g());
        assert_eq!(d.memory_info().unwrap().total, 16 * GIB);
    }

    #[test]
    fn cost_model_matches_h200_figures() {
        assert_eq!(CostModel::H200.cost(0), 94_000);
        let at_gib = CostModel::H200.cost(1 << 30);
        assert!((990_000..=1_010_000).contains(&at_gib), "{at_gib}");
    }
}
