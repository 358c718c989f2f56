//! Facts the HIP API does not give portably, read from Linux sysfs.
//!
//! * The gfx architecture name: HIP only has it in `hipDeviceProp_t::gcnArchName`, whose struct
//!   layout differs between ROCm 5 and 6, so it is read from the KFD topology instead
//!   (`gfx_target_version` of the node at the device's PCI location).
//! * The GTT size of integrated (UMA) devices: on APUs most of what the GPU can use is GTT
//!   (system memory mapped through the GART), which `hipMemGetInfo` does not show separately.
//!
//! * The device memory this process holds, the runtime's included, as amdkfd counts it per
//!   process (what `rocm-smi` shows): the figure a user compares runtimes by.
//!
//! * `HSA_OVERRIDE_GFX_VERSION`, which the ROCm runtime honours to treat a card as another ISA
//!   (Radeon owners set `10.3.0` or `11.0.0` so that kernels built for a neighbour run): the
//!   kernels are compiled for the architecture it names, as the runtime would load them.
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

/// The ROCm runtime's variable that makes a device report another gfx version.
pub const HSA_OVERRIDE_GFX_VERSION: &str = "HSA_OVERRIDE_GFX_VERSION";

/// Reads a `HSA_OVERRIDE_GFX_VERSION` value, `major.minor.stepping` in decimal as the ROCm
/// runtime takes it, into a gfx name: `11.0.0` → `gfx1100`, `10.3.0` → `gfx1030`, `9.0.10` →
/// `gfx90a`. The error says what was wrong and what the form is.
pub fn gfx_name_from_override(text: &str) -> Result<String, String> {
    let form = "the form is MAJOR.MINOR.STEPPING in decimal, e.g. 11.0.0 for gfx1100, 10.3.0 \
                for gfx1030 or 9.0.10 for gfx90a";
    let parts: Vec<&str> = text.trim().split('.').collect();
    let [major, minor, stepping] = parts[..] else {
        return Err(format!(
            "{HSA_OVERRIDE_GFX_VERSION}={text:?} is not three numbers; {form}"
        ));
    };
    // Major 0 is no GPU; a minor or stepping above 15 has no hex digit in a gfx name.
    let number = |what: &str, s: &str, range: std::ops::RangeInclusive<u32>| match s.parse::<u32>()
    {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(format!(
            "{HSA_OVERRIDE_GFX_VERSION}={text:?}: the {what} {s:?} is not a number from {} \
                 to {}; {form}",
            range.start(),
            range.end()
        )),
    };
    let major = number("major version", major, 1..=99)?;
    let minor = number("minor version", minor, 0..=15)?;
    let stepping = number("stepping", stepping, 0..=15)?;
    // In range, the target version always has a name; the error only guards a change there.
    gfx_name_from_target_version(major * 10_000 + minor * 100 + stepping)
        .ok_or_else(|| format!("{HSA_OVERRIDE_GFX_VERSION}={text:?}; {form}"))
}

/// The gfx name kernels are compiled for on the AMD device at `pci`: the one
/// `HSA_OVERRIDE_GFX_VERSION` names when it is set and not empty (`override_text`), else the
/// KFD topology's. A malformed override is an error, never ignored.
pub fn gfx_arch(
    topology: &Path,
    pci: PciLocation,
    override_text: Option<&str>,
) -> Result<Option<String>, String> {
    match override_text.map(str::trim).filter(|t| !t.is_empty()) {
        Some(text) => gfx_name_from_override(text).map(Some),
        None => Ok(gfx_arch_for_pci(topology, pci.domain, pci.bus, pci.device)),
    }
}

/// Finds the KFD node at the given PCI location and returns its gfx name.
///
/// KFD's `location_id` is `bus << 8 | device << 3 | function` and `domain` is separate.
pub fn gfx_arch_for_pci(topology: &Path, domain: u32, bus: u32, device: u32) -> Option<String> {
    let pci = PciLocation {
        domain,
        bus,
        device,
    };
    let node = kfd_node_at(topology, pci)?;
    gfx_name_from_target_version(node_field(&node.properties, "gfx_target_version")?)
}

/// Where amdkfd lists what each process holds on each GPU (`<pid>/vram_<gpu_id>`).
pub const KFD_PROCESSES: &str = "/sys/class/kfd/kfd/proc";

/// The device memory process `pid` holds on the AMD GPU at `pci`, in bytes, as amdkfd counts
/// it (`<processes>/<pid>/vram_<gpu_id>`, the GPU named by the `gpu_id` of its topology node):
/// every allocation of the process on that GPU, the runtime's own included, which is the
/// per-process figure `rocm-smi --showpids` and `amd-smi process` print. `None` when a file is
/// missing or unreadable (not amdkfd, another PID namespace, no such node).
pub fn kfd_process_vram(
    topology: &Path,
    processes: &Path,
    pci: PciLocation,
    pid: u32,
) -> Option<u64> {
    let node = kfd_node_at(topology, pci)?;
    let gpu_id: u32 = std::fs::read_to_string(node.dir.join("gpu_id"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    std::fs::read_to_string(
        processes
            .join(pid.to_string())
            .join(format!("vram_{gpu_id}")),
    )
    .ok()?
    .trim()
    .parse()
    .ok()
}

/// A KFD topology node: its directory and its `properties` text.
struct KfdNode {
    dir: std::path::PathBuf,
    properties: String,
}

/// The KFD node of the GPU at `pci`. KFD's `location_id` is `bus << 8 | device << 3 |
/// function` and `domain` is separate; CPU nodes (`gfx_target_version 0`) are skipped.
fn kfd_node_at(topology: &Path, pci: PciLocation) -> Option<KfdNode> {
    let nodes = std::fs::read_dir(topology).ok()?;
    for node in nodes.flatten() {
        let Ok(text) = std::fs::read_to_string(node.path().join("properties")) else {
            continue;
        };
        let (Some(version), Some(location)) = (
            node_field(&text, "gfx_target_version"),
            node_field(&text, "location_id"),
        ) else {
            continue;
        };
        let domain = node_field(&text, "domain").unwrap_or(0);
        if version != 0
            && domain == pci.domain
            && location >> 8 == pci.bus
            && (location & 0xff) >> 3 == pci.device
        {
            return Some(KfdNode {
                dir: node.path(),
                properties: text,
            });
        }
    }
    None
}

/// The number after `key` on its line of a topology `properties` file.
fn node_field(properties: &str, key: &str) -> Option<u32> {
    properties.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        (parts.next() == Some(key)).then(|| parts.next()?.parse().ok())?
    })
}
