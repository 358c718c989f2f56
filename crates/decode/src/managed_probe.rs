//! Does managed memory migrate to the device on this platform? Measured, not assumed.
//!
//! Managed (unified) memory is one address for host and device. Whether a kernel reading it
//! gets device bandwidth depends on the platform: where the driver migrates pages on a device
//! fault (NVIDIA discrete GPUs; AMD with XNACK on), the first read moves the pages and later
//! reads are device-local; where it does not (AMD without XNACK, some APU setups), every read
//! crosses the host link, and managed memory is only a slower way to do zero-copy. So managed
//! memory is used only after this probe measures that it migrates, and refused otherwise with
//! the measured rates.
//!
//! The probe: a buffer of managed memory is written on the host (its pages are then on the
//! host), and a read kernel (rocm-kernels' argmax, which reads every value once and writes one
//! index) runs over it twice, timed with events. The same kernel over a device buffer of the
//! same size gives the device rate to compare with. The verdict is "migrates" when the second
//! pass reads at [`MIGRATES_FRACTION`] or more of the device rate.

use crate::error::{DecodeError, Result};
use crate::link_probe::ReadBench;
use hip_ffi::{Device, ManagedBuffer};

/// The probe's buffer: large enough that launch overhead (microseconds) is noise next to the
/// transfer (tens of microseconds on HBM, milliseconds over PCIe), small enough to fit beside
/// a loaded model.
pub const PROBE_BYTES: usize = 256 << 20;

/// The second pass must read at this share of the device rate or more to count as migrated.
/// Why a quarter: a host link reads at 1–2 % of HBM (PCIe Gen5 x16 about 50 GB/s against the
/// H200's 4.4 TB/s; an APU's host path is not faster than its device path either), while
/// migrated pages read like device memory, so the two cases sit far on either side. A quarter
/// leaves room for a partly migrated buffer or a noisy pass without letting a host-link rate
/// through, even on a card whose device bandwidth is ten times lower.
pub const MIGRATES_FRACTION: f64 = 0.25;

/// What the probe measured, in GB/s (10⁹ bytes per second).
#[derive(Clone, Debug, PartialEq)]
pub struct ManagedProbe {
    /// Bytes each pass read.
    pub bytes: usize,
    /// The read kernel over device memory.
    pub device_gbps: f64,
    /// The first pass over managed memory written on the host (migration, if any, happens
    /// here).
    pub first_gbps: f64,
    /// The second pass over the same managed memory.
    pub second_gbps: f64,
}

impl ManagedProbe {
    /// Whether the second pass read at device speed (see [`MIGRATES_FRACTION`]).
    pub fn migrates(&self) -> bool {
        self.second_gbps >= MIGRATES_FRACTION * self.device_gbps
    }

    /// `Ok` when managed memory may be used, else the refusal with the measured rates.
    pub fn verdict(&self) -> std::result::Result<(), String> {
        if self.migrates() {
            Ok(())
        } else {
            Err(format!(
                "managed memory refused: written on the host, it read at {:.1} GB/s on the \
                 device's second pass, below {:.0}% of the {:.0} GB/s the same kernel reads \
                 device memory at, so its pages stay on the host (no migration) and it would \
                 only be a slower zero-copy; offloaded weights use mapped pinned host memory",
                self.second_gbps,
                MIGRATES_FRACTION * 100.0,
                self.device_gbps
            ))
        }
    }
}

impl std::fmt::Display for ManagedProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "managed-memory probe: {} MiB read by a kernel (argmax) after a host write",
            self.bytes >> 20
        )?;
        writeln!(f, "  device memory          {:>9.1} GB/s", self.device_gbps)?;
        writeln!(f, "  managed, first pass    {:>9.1} GB/s", self.first_gbps)?;
        writeln!(f, "  managed, second pass   {:>9.1} GB/s", self.second_gbps)?;
        match self.verdict() {
            Ok(()) => writeln!(
                f,
                "  verdict: migrates (second pass at {:.0}% of device memory, threshold {:.0}%)",
                100.0 * self.second_gbps / self.device_gbps,
                MIGRATES_FRACTION * 100.0
            ),
            Err(reason) => writeln!(f, "  verdict: {reason}"),
        }
    }
}

fn gpu(what: &str) -> impl Fn(hip_ffi::HipError) -> DecodeError + '_ {
    move |e| DecodeError::Gpu(format!("managed-memory probe, {what}: {e}"))
}

/// Runs the probe on `device` with `bytes` (a multiple of 4, at least 4 KiB). A device without
/// managed memory is an error naming that, not a verdict.
pub fn probe(device: &Device, bytes: usize) -> Result<ManagedProbe> {
    if bytes < 4096 || !bytes.is_multiple_of(4) {
        return Err(DecodeError::InvalidArgument(format!(
            "the managed-memory probe reads whole f32 values, at least 4 KiB; got {bytes} bytes"
        )));
    }
    if !device
        .supports_managed_memory()
        .map_err(gpu("reading the device's attributes"))?
    {
        return Err(DecodeError::Gpu(
            "managed memory refused: this device does not support it (its managed-memory \
             attribute is 0); offloaded weights use mapped pinned host memory"
                .into(),
        ));
    }
    let bench = ReadBench::new(device, bytes)?;
    let mut managed = ManagedBuffer::alloc(device, bytes).map_err(gpu("managed memory"))?;
    // SAFETY: no device work touches the managed buffer yet (allocation synchronised).
    let host = unsafe { managed.host_slice_mut::<f32>() };
    for (i, v) in host.iter_mut().enumerate() {
        *v = (i % 1021) as f32;
    }
    let read = |addr: u64| -> Result<f64> {
        // SAFETY: `addr` is the device buffer or the managed one, both of `bytes` and alive
        // until this function returns; each pass synchronises the stream.
        bench.timed(|| unsafe { bench.read(addr) })
    };
    // A warm-up pass loads the kernel and warms the caches' translation entries.
    read(bench.on_device.ptr().0)?;
    let device_gbps = read(bench.on_device.ptr().0)?;
    let first_gbps = read(managed.ptr().0)?;
    let second_gbps = read(managed.ptr().0)?;
    Ok(ManagedProbe {
        bytes,
        device_gbps,
        first_gbps,
        second_gbps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe_with(second_gbps: f64) -> ManagedProbe {
        ManagedProbe {
            bytes: PROBE_BYTES,
            device_gbps: 3000.0,
            first_gbps: 20.0,
            second_gbps,
        }
    }

    #[test]
    fn the_verdict_compares_the_second_pass_with_device_memory() {
        assert!(probe_with(2900.0).verdict().is_ok());
        assert!(probe_with(750.0).verdict().is_ok(), "exactly a quarter");
        let refusal = probe_with(50.0).verdict().expect_err("a host-link rate");
        assert!(refusal.contains("50.0 GB/s"), "{refusal}");
        assert!(refusal.contains("3000 GB/s"), "{refusal}");
        assert!(refusal.contains("no migration"), "{refusal}");
        let text = probe_with(50.0).to_string();
        assert!(text.contains("verdict: managed memory refused"), "{text}");
        assert!(probe_with(2900.0).to_string().contains("verdict: migrates"));
    }
}
