//! The link model: how fast the device reads its own memory and how fast host memory reaches
//! it, the three numbers the planner's prediction rests on.

use std::fmt;

const GB: f64 = 1e9;

const H200_ORIGIN: &str = "H200 defaults: HBM 4.4 TB/s measured by a kernel; zero-copy \
    50 GB/s and host compute 40 GB/s measured in offloaded runs; copy 55 GB/s measured by \
    hipdecode probe-link";

/// Read and transfer rates, in bytes per second (decimal GB/s × 10^9).
///
/// The defaults ([`LinkModel::h200_default`]) are figures measured on an H200 on a PCIe Gen5
/// x16 host link; other machines pass theirs through the fields (or `hipdecode plan`'s
/// `--hbm-gbps`, `--zero-copy-gbps`, `--copy-gbps` and `--host-compute-gbps`; `hipdecode
/// probe-link` measures the link's two rates and `hipdecode probe-host` the host's cores).
#[derive(Clone, Debug, PartialEq)]
pub struct LinkModel {
    /// Device memory read by a kernel. Default 4.4 TB/s: the H200's read bandwidth as the
    /// project measured it with a kernel (docs/benchmark_results/gpu-speed-2026-11-30.md).
    pub device_read: f64,
    /// Kernels reading mapped pinned host memory in place ("zero-copy"). Default 50 GB/s:
    /// PCIe Gen5 x16 carries 64 GB/s raw per direction; the 8B shape with every weight read in
    /// place ran at 12.2 tok/s over 4.3 GB per token on the H200, 52 GB/s
    /// (docs/benchmark_results/offload-sweep-2026-11-30.md, 1003 MiB).
    pub zero_copy_read: f64,
    /// Copy-engine transfers from pinned host memory to device memory. Default 55 GB/s:
    /// `hipdecode probe-link` measured 55.5 GB/s on the H200 (512 MiB copies; a kernel's
    /// zero-copy read of the same memory: 51.2).
    pub copy: f64,
    /// Offloaded decode products computed by the host's cores, reading host memory while the
    /// GPU reads its share of the same weights across the link (the hybrid split): the two
    /// rates add for weights read in place. 0 when the split is off. Default:
    /// [`LinkModel::H200_HOST_COMPUTE_GBPS`].
    pub host_compute: f64,
    /// Where the numbers come from, printed with the prediction.
    pub origin: String,
}

/// A rate that is not a positive finite number.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the link model's {what} is {value} bytes/s; it must be a positive finite number (e.g. 50e9 for 50 GB/s)")]
pub struct InvalidLink {
    /// Which rate.
    pub what: &'static str,
    /// The rejected value.
    pub value: f64,
}

impl LinkModel {
    /// The H200 figures described on each field.
    pub const H200_DEFAULT_GBPS: [f64; 3] = [4400.0, 50.0, 55.0];

    /// The host's cores' rate on offloaded products beside the GPU's zero-copy reads on the
    /// H200's host (16 Sapphire Rapids cores), GB/s: measured in the middle of hybrid runs,
    /// 46 GB/s on the 8B's rows and 35-36 GB/s on the 30B-A3B's experts (`hipdecode
    /// probe-host` alone: 46-55 on Q4_K, 44 on Q6_K); see
    /// docs/benchmark_results/offload-hybrid-2026-12-01.md.
    pub const H200_HOST_COMPUTE_GBPS: f64 = 40.0;

    /// The H200 defaults (see the fields), with the hybrid split on.
    pub fn h200_default() -> LinkModel {
        let [hbm, zero_copy, copy] = Self::H200_DEFAULT_GBPS;
        LinkModel::from_gbps(hbm, zero_copy, copy, H200_ORIGIN)
            .with_host_compute_gbps(Self::H200_HOST_COMPUTE_GBPS)
    }

    /// A model from rates in GB/s (10^9 bytes per second), without host compute.
    pub fn from_gbps(device_read: f64, zero_copy_read: f64, copy: f64, origin: &str) -> LinkModel {
        LinkModel {
            device_read: device_read * GB,
            zero_copy_read: zero_copy_read * GB,
            copy: copy * GB,
            host_compute: 0.0,
            origin: origin.to_string(),
        }
    }

    /// The same with the host's cores computing offloaded products at `gbps` (0: the split is
    /// off).
    pub fn with_host_compute_gbps(mut self, gbps: f64) -> LinkModel {
        self.host_compute = gbps * GB;
        self
    }

    /// The rate at which a token's reads of weights left in host memory are served: the GPU's
    /// zero-copy reads and the host's cores together.
    pub fn in_place_read(&self) -> f64 {
        self.zero_copy_read + self.host_compute
    }

    /// Checks that every rate is a positive finite number.
    pub fn validate(&self) -> Result<(), InvalidLink> {
        for (what, value) in [
            ("device read rate", self.device_read),
            ("zero-copy read rate", self.zero_copy_read),
            ("copy rate", self.copy),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(InvalidLink { what, value });
            }
        }
        if !(self.host_compute.is_finite() && self.host_compute >= 0.0) {
            return Err(InvalidLink {
                what: "host compute rate",
                value: self.host_compute,
            });
        }
        Ok(())
    }
}

impl fmt::Display for LinkModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "device {:.0} GB/s, zero-copy {:.1} GB/s, copy {:.1} GB/s, host compute {:.1} GB/s ({})",
            self.device_read / GB,
            self.zero_copy_read / GB,
            self.copy / GB,
            self.host_compute / GB,
            self.origin
        )
    }
}
