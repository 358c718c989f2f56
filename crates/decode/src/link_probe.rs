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
    move |e| DecodeError::Gpu(format!("GPU probe, {what}: {e}"))
}

/// What the probes share: the read kernel (rocm-kernels' argmax, which reads every value once
/// and writes one index), its stream and scratch, and a device buffer of the probe's size.
pub(crate) struct ReadBench {
    device: Device,
    kernels: Kernels,
    pub(crate) stream: Stream,
    workspace: DeviceBuffer,
    out: DeviceBuffer,
    /// Bytes each pass moves.
    pub(crate) bytes: usize,
    /// `bytes` of zeros on the device.
    pub(crate) on_device: DeviceBuffer,
}

impl ReadBench {
    /// Loads the kernels and allocates the buffers for passes of `bytes` (a multiple of 4).
    pub(crate) fn new(device: &Device, bytes: usize) -> Result<ReadBench> {
        let cache = KernelCache::from_env().map_err(|e| DecodeError::Gpu(e.to_string()))?;
        let kernels =
            Kernels::load(device, &cache).map_err(|e| DecodeError::Gpu(format!("kernels: {e}")))?;
        let alloc = |n: usize, what: &str| {
            DeviceBuffer::alloc(device, n).map_err(|e| DecodeError::Gpu(format!("{what}: {e}")))
        };
        let mut on_device = alloc(bytes, "a device buffer")?;
        on_device.memset(0).map_err(gpu("a device buffer"))?;
        Ok(ReadBench {
            device: *device,
            stream: Stream::new(device).map_err(gpu("a stream"))?,
            workspace: alloc(sampling::ARGMAX_WORKSPACE * 8, "workspace")?,
            out: alloc(4, "workspace")?,
            kernels,
            bytes,
            on_device,
        })
    }

    /// One pass of `pass`, timed with events on the stream, as GB/s over `bytes`.
    pub(crate) fn timed(&self, pass: impl FnOnce() -> Result<()>) -> Result<f64> {
        let (start, end) = (
            Event::new(&self.device).map_err(gpu("an event"))?,
            Event::new(&self.device).map_err(gpu("an event"))?,
        );
        start
            .record(&self.stream)
            .map_err(gpu("recording an event"))?;
        pass()?;
        end.record(&self.stream)
            .map_err(gpu("recording an event"))?;
        self.stream.synchronize().map_err(gpu("a timed pass"))?;
        let ms = end.elapsed_ms_since(&start).map_err(gpu("timing"))? as f64;
        Ok(if ms > 0.0 {
            self.bytes as f64 / (ms * 1e-3) / 1e9
        } else {
            f64::INFINITY
        })
    }

    /// The median of [`PASSES`] timed passes after one warm-up.
    fn median(&self, mut pass: impl FnMut() -> Result<()>) -> Result<f64> {
        self.timed(&mut pass)?;
        let mut rates = (0..PASSES)
            .map(|_| self.timed(&mut pass))
            .collect::<Result<Vec<f64>>>()?;
        rates.sort_by(f64::total_cmp);
        Ok(rates[PASSES / 2])
    }

    /// Queues the read kernel over the `bytes / 4` f32 at `addr`.
    ///
    /// # Safety
    /// `addr` holds `bytes / 4` f32 readable by the device, alive until the stream has run the
    /// kernel.
    pub(crate) unsafe fn read(&self, addr: u64) -> Result<()> {
        // SAFETY: the caller vouches for `addr`; the workspace holds ARGMAX_WORKSPACE u64 and
        // `out` one i32, device memory only this bench's stream uses.
        let (values, mut ws, mut o) = unsafe {
            (
                DeviceSlice::<f32>::from_raw(addr, self.bytes / 4),
                DeviceSliceMut::<u64>::from_raw(self.workspace.ptr().0, sampling::ARGMAX_WORKSPACE),
                DeviceSliceMut::<i32>::from_raw(self.out.ptr().0, 1),
            )
        };
        sampling::argmax(
            &self.kernels,
            &self.stream,
            values,
            self.bytes / 4,
            &mut ws,
            &mut o,
        )
        .map_err(|e| DecodeError::Gpu(format!("the read kernel (argmax): {e}")))
    }
}

/// Runs the probe on `device` with `bytes` (a multiple of 4, at least 1 MiB).
pub fn probe(device: &Device, bytes: usize) -> Result<LinkProbe> {
    if bytes < (1 << 20) || !bytes.is_multiple_of(4) {
        return Err(DecodeError::InvalidArgument(format!(
            "the link probe moves whole f32 values, at least 1 MiB; got {bytes} bytes"
        )));
    }
    let bench = ReadBench::new(device, bytes)?;
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
    // Each buffer holds `bytes` and lives until this function returns, and every pass
    // synchronises the stream before the next.
    let device_gbps = bench.median(|| {
        // SAFETY: the device buffer, as above.
        unsafe { bench.read(bench.on_device.ptr().0) }
    })?;
    let zero_copy_gbps = bench.median(|| {
        // SAFETY: the mapped pinned buffer's device address, as above.
        unsafe { bench.read(pinned.device_ptr().0) }
    })?;
    let copy_gbps = bench.median(|| {
        // SAFETY: the device buffer is the copy's destination and the pinned buffer its source,
        // as above.
        unsafe {
            bench
                .stream
                .copy_from_host_raw(bench.on_device.ptr(), pinned.as_slice::<u8>())
        }
        .map_err(gpu("the copy"))
    })?;
    Ok(LinkProbe {
        bytes,
        device_gbps,
        zero_copy_gbps,
        copy_gbps,
    })
}
