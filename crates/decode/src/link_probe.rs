//! The host link's two rates, measured: a kernel reading mapped pinned host memory in place
//! (zero-copy, what decode does with offloaded weights), and the copy engine moving pinned
//! host memory into device memory (what the streamed prefetch does). The planner's link model
//! compares them per tensor, so they are measured on the machine rather than assumed.
//!
//! Both use one buffer of pinned host memory. The read is rocm-kernels' argmax, which reads
//! every value once (the managed-memory probe's kernel); the copy is one `hipMemcpyHtoDAsync`
//! of the whole buffer. Each is timed with events, after a warm-up, and the median of
//! [`PASSES`] is kept.

use crate::error::{DecodeError, Result};
use hip_ffi::{Device, DeviceBuffer, Event, PinnedHostBuffer, Stream};
use rocm_kernels::cache::KernelCache;
use rocm_kernels::ops::sampling;
use rocm_kernels::{DeviceSlice, DeviceSliceMut, Kernels};

/// Timed passes per rate (after one warm-up); the median is kept.
pub const PASSES: usize = 5;

/// What the probe measured, in GB/s (10⁹ bytes per second).
#[derive(Clone, Debug, PartialEq)]
pub struct LinkProbe {
    /// Bytes each pass moved.
    pub bytes: usize,
    /// The read kernel over device memory, for scale.
    pub device_gbps: f64,
    /// The same kernel over mapped pinned host memory.
    pub zero_copy_gbps: f64,
    /// The copy engine, pinned host memory to device memory.
    pub copy_gbps: f64,
}

impl std::fmt::Display for LinkProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "host link probe: {} MiB per pass, median of {PASSES}",
            self.bytes >> 20
        )?;
        writeln!(
            f,
            "  device memory, kernel read     {:>8.1} GB/s",
            self.device_gbps
        )?;
        writeln!(
            f,
            "  pinned host, kernel read       {:>8.1} GB/s   (zero-copy: --zero-copy-gbps)",
            self.zero_copy_gbps
        )?;
        writeln!(
            f,
            "  pinned host, copy engine       {:>8.1} GB/s   (streaming: --copy-gbps)",
            self.copy_gbps
        )
    }
}

fn gpu(what: &str) -> impl Fn(hip_ffi::HipError) -> DecodeError + '_ {
    move |e| DecodeError::Gpu(format!("link probe, {what}: {e}"))
}

/// One pass of `pass`, timed with events on `stream`, as GB/s over `bytes`.
pub(crate) fn timed_gbps(
    device: &Device,
    stream: &Stream,
    bytes: usize,
    pass: impl FnOnce() -> Result<()>,
) -> Result<f64> {
    let (start, end) = (
        Event::new(device).map_err(gpu("an event"))?,
        Event::new(device).map_err(gpu("an event"))?,
    );
    start.record(stream).map_err(gpu("recording an event"))?;
    pass()?;
    end.record(stream).map_err(gpu("recording an event"))?;
    stream.synchronize().map_err(gpu("a timed pass"))?;
    let ms = end.elapsed_ms_since(&start).map_err(gpu("timing"))? as f64;
    Ok(if ms > 0.0 {
        bytes as f64 / (ms * 1e-3) / 1e9
    } else {
        f64::INFINITY
    })
}

/// The median of [`PASSES`] timed passes after one warm-up.
fn median_gbps(
    device: &Device,
    stream: &Stream,
    bytes: usize,
    mut pass: impl FnMut() -> Result<()>,
) -> Result<f64> {
    timed_gbps(device, stream, bytes, &mut pass)?;
    let mut rates = (0..PASSES)
        .map(|_| timed_gbps(device, stream, bytes, &mut pass))
        .collect::<Result<Vec<f64>>>()?;
    rates.sort_by(f64::total_cmp);
    Ok(rates[PASSES / 2])
}

/// Queues rocm-kernels' argmax over the `n` f32 at `addr` (a read of every value).
///
/// # Safety
/// `addr` holds `n` f32 readable by the device, alive until the stream has run the kernel;
/// `workspace` holds [`sampling::ARGMAX_WORKSPACE`] u64 and `out` one i32, both device memory
/// used by nothing else meanwhile.
pub(crate) unsafe fn read_all(
    kernels: &Kernels,
    stream: &Stream,
    addr: u64,
    n: usize,
    workspace: &DeviceBuffer,
    out: &DeviceBuffer,
) -> Result<()> {
    // SAFETY: the caller's contract.
    let (values, mut ws, mut o) = unsafe {
        (
            DeviceSlice::<f32>::from_raw(addr, n),
            DeviceSliceMut::<u64>::from_raw(workspace.ptr().0, sampling::ARGMAX_WORKSPACE),
            DeviceSliceMut::<i32>::from_raw(out.ptr().0, 1),
        )
    };
    sampling::argmax(kernels, stream, values, n, &mut ws, &mut o)
        .map_err(|e| DecodeError::Gpu(format!("the read kernel (argmax): {e}")))
}

/// Runs the probe on `device` with `bytes` (a multiple of 4, at least 1 MiB).
pub fn probe(device: &Device, bytes: usize) -> Result<LinkProbe> {
    if bytes < (1 << 20) || bytes % 4 != 0 {
        return Err(DecodeError::InvalidArgument(format!(
            "the link probe moves whole f32 values, at least 1 MiB; got {bytes} bytes"
        )));
    }
    let cache = KernelCache::from_env().map_err(|e| DecodeError::Gpu(e.to_string()))?;
    let kernels =
        Kernels::load(device, &cache).map_err(|e| DecodeError::Gpu(format!("kernels: {e}")))?;
    let stream = Stream::new(device).map_err(gpu("a stream"))?;
    let n = bytes / 4;
    let workspace =
        DeviceBuffer::alloc(device, sampling::ARGMAX_WORKSPACE * 8).map_err(gpu("workspace"))?;
    let out = DeviceBuffer::alloc(device, 4).map_err(gpu("workspace"))?;
    let mut on_device = DeviceBuffer::alloc(device, bytes).map_err(gpu("a device buffer"))?;
    on_device.memset(0).map_err(gpu("a device buffer"))?;
    let mut pinned =
        PinnedHostBuffer::alloc(device, bytes).map_err(|e| DecodeError::Allocation {
            what: format!(
                "{} MiB of pinned host memory for the link probe",
                bytes >> 20
            ),
            reason: e.to_string(),
        })?;
    for (i, v) in pinned.as_mut_slice::<f32>().iter_mut().enumerate() {
        *v = (i % 1021) as f32;
    }
    let device_gbps = median_gbps(device, &stream, bytes, || {
        // SAFETY: the device buffer holds `n` f32 and lives until this function returns, after
        // the stream is synchronised; workspace and out are sized for argmax.
        unsafe { read_all(&kernels, &stream, on_device.ptr().0, n, &workspace, &out) }
    })?;
    let zero_copy_gbps = median_gbps(device, &stream, bytes, || {
        // SAFETY: as above, for the mapped pinned buffer's device address.
        unsafe {
            read_all(
                &kernels,
                &stream,
                pinned.device_ptr().0,
                n,
                &workspace,
                &out,
            )
        }
    })?;
    let copy_gbps = median_gbps(device, &stream, bytes, || {
        // SAFETY: the pinned buffer outlives the pass (each pass synchronises the stream), and
        // the device buffer holds `bytes`.
        unsafe { on_device.copy_from_host_async(pinned.as_slice::<u8>(), &stream) }
            .map_err(gpu("the copy"))
    })?;
    Ok(LinkProbe {
        bytes,
        device_gbps,
        zero_copy_gbps,
        copy_gbps,
    })
}
