//! The device memory this process holds, as the vendor's per-process tools show it:
//! `nvidia-smi --query-compute-apps=used_memory` (NVML) on NVIDIA, amdkfd's per-process VRAM
//! (what `rocm-smi --showpids` and `amd-smi process` print) on AMD.
//!
//! That figure includes what no allocator sees: the runtime's context, loaded kernel modules,
//! libraries' own device memory. It is the number users compare runtimes by, so the memory
//! reports put it beside their own accounting and say what lies between.
//!
//! Both sources list processes by the id the kernel's first PID namespace gives them. A
//! process inside a container with its own PID namespace has another id, and then the figure
//! is unavailable, with that reason.

use crate::device::Device;
use crate::ffi::nvml::Nvml;
use crate::platform::PlatformKind;
use crate::sysfs;
use std::path::Path;
use std::sync::OnceLock;

/// This process's device memory on one device, and where the figure came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessMemory {
    pub bytes: u64,
    /// `"NVML"` or `"amdkfd"`.
    pub source: &'static str,
}

/// The ids this process may be listed under: its own, then those `/proc/self/status` gives in
/// the enclosing PID namespaces it can see (`NSpid`, outermost first).
fn own_ids() -> Vec<u32> {
    let mut ids = vec![std::process::id()];
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        if let Some(line) = status.lines().find(|l| l.starts_with("NSpid:")) {
            ids.extend(
                line["NSpid:".len()..]
                    .split_whitespace()
                    .filter_map(|id| id.parse::<u32>().ok()),
            );
        }
    }
    ids.dedup();
    ids
}

fn nvml() -> &'static std::result::Result<Nvml, String> {
    static NVML: OnceLock<std::result::Result<Nvml, String>> = OnceLock::new();
    NVML.get_or_init(Nvml::load)
}

impl Device {
    /// This process's memory on the device as `nvidia-smi` or `rocm-smi` show it, context
    /// included; the error says why it cannot be read here (no NVML or amdkfd, another PID
    /// namespace, the driver does not say).
    pub fn process_memory(&self) -> std::result::Result<ProcessMemory, String> {
        let pci = self.pci_location().map_err(|e| e.to_string())?;
        let ids = own_ids();
        match self.platform() {
            PlatformKind::Nvidia => {
                let nvml = nvml().as_ref().map_err(Clone::clone)?;
                let bus_id = format!("{:08x}:{:02x}:{:02x}.0", pci.domain, pci.bus, pci.device);
                let listed = nvml.processes(&bus_id)?;
                let ours = listed
                    .iter()
                    .find(|p| ids.contains(&p.pid))
                    .ok_or_else(|| {
                        format!(
                            "NVML lists {} process(es) on {bus_id}, none with this process's id \
                         ({ids:?}); a container's PID namespace hides it",
                            listed.len()
                        )
                    })?;
                let bytes = ours
                    .bytes
                    .ok_or("NVML does not know this process's device memory")?;
                Ok(ProcessMemory {
                    bytes,
                    source: "NVML",
                })
            }
            PlatformKind::Amd => ids
                .iter()
                .find_map(|&pid| {
                    sysfs::kfd_process_vram(
                        Path::new(sysfs::KFD_TOPOLOGY),
                        Path::new(sysfs::KFD_PROCESSES),
                        pci,
                        pid,
                    )
                })
                .map(|bytes| ProcessMemory {
                    bytes,
                    source: "amdkfd",
                })
                .ok_or_else(|| {
                    format!(
                        "amdkfd has no vram file of this process ({ids:?}) for the GPU at {}",
                        pci.sysfs_name()
                    )
                }),
            PlatformKind::None => Err("no GPU platform".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_is_listed_under_its_own_id_first() {
        let ids = own_ids();
        assert_eq!(ids[0], std::process::id());
    }
}
