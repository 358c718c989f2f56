//! Facts the HIP API does not give portably, read from Linux sysfs.
//!
//! * The gfx architecture name: HIP only has it in `hipDeviceProp_t::gcnArchName`, whose struct
//!   layout differs between ROCm 5 and 6, so it is read from the KFD topology instead
//!   (`gfx_target_version` of the node at the device's PCI location).
//! * The GTT size of integrated (UMA) devices: on APUs most of what the GPU can use is GTT
//!   (system memory mapped through the GART), which `hipMemGetInfo` does not show separately.
//!
//! Every reader takes the sysfs root as a parameter so tests can point it at a temp dir.

use std::path::Path;

/// Where the amdkfd driver publishes its topology.
pub const KFD_TOPOLOGY: &str = "/sys/class/kfd/kfd/topology/nodes";
/// Where PCI devices (and amdgpu's `mem_info_*` files) live.
pub const PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// GTT (graphics translation table) memory as amdgpu reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GttInfo {
    /// `mem_info_gtt_total`, bytes.
    pub total: u64,
    /// `mem_info_gtt_used`, bytes.
    pub used: u64,
}

/// A PCI location as HIP's attributes give it (`hipDeviceAttributePci*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciLocation {
    /// PCI domain.
    pub domain: u32,
    /// PCI bus.
    pub bus: u32,
    /// PCI device (slot).
    pub device: u32,
}

impl PciLocation {
    /// The sysfs directory name of function 0, e.g. `0000:c3:00.0`.
    pub fn sysfs_name(&self) -> String {
        format!("{:04x}:{:02x}:{:02x}.0", self.domain, self.bus, self.device)
    }
}

/// Reads `mem_info_gtt_total` and `mem_info_gtt_used` of the device at `pci` under `pci_root`.
/// `None` when either file is missing or unreadable (not amdgpu, no permission, no such device).
pub fn gtt_info(pci_root: &Path, pci: PciLocation) -> Option<GttInfo> {
    let dir = pci_root.join(pci.sysfs_name());
    let read = |name: &str| -> Option<u64> {
        std::fs::read_to_string(dir.join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some(GttInfo {
        total: read("mem_info_gtt_total")?,
        used: read("mem_info_gtt_used")?,
    })
}

/// Turns KFD's `gfx_target_version` (major * 10000 + minor * 100 + stepping) into a gfx name:
/// 110501 → `gfx1151`, 90010 → `gfx90a`, 90402 → `gfx942`. Zero (a CPU node) gives `None`.
pub fn gfx_name_from_target_version(version: u32) -> Option<String> {
    if version == 0 {
        return None;
    }
    let major = version / 10_000;
    let minor = (version / 100) % 100;
    let stepping = version % 100;
    if minor > 15 || stepping > 15 {
        return None;
    }
    Some(format!("gfx{major}{minor:x}{stepping:x}"))
}

/// Finds the KFD node at the given PCI location and returns its gfx name.
///
/// KFD's `location_id` is `bus << 8 | device << 3 | function` and `domain` is separate.
pub fn gfx_arch_for_pci(topology: &Path, domain: u32, bus: u32, device: u32) -> Option<String> {
    let nodes = std::fs::read_dir(topology).ok()?;
    for node in nodes.flatten() {
        let Ok(text) = std::fs::read_to_string(node.path().join("properties")) else {
            continue;
        };
        let field = |key: &str| -> Option<u32> {
            text.lines().find_map(|line| {
                let mut parts = line.split_whitespace();
                (parts.next() == Some(key)).then(|| parts.next()?.parse().ok())?
            })
        };
        let (Some(version), Some(location)) = (field("gfx_target_version"), field("location_id"))
        else {
            continue;
        };
        let node_domain = field("domain").unwrap_or(0);
        if node_domain == domain && location >> 8 == bus && (location & 0xff) >> 3 == device {
            return gfx_name_from_target_version(version);
        }
    }
    None
}
