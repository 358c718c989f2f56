//! Which GPU platform this process can use: AMD (HIP), NVIDIA (CUDA) or none.

use crate::device::Device;
use crate::error::{ErrorKind, HipError, Result};
use crate::ffi::{cuda::CudaApi, hip::HipApi, GpuApi};
use crate::knobs::ForcedPlatform;
pub use crate::platform_kind::PlatformKind;
use std::fmt;
use std::sync::OnceLock;

/// What a `*_VISIBLE_DEVICES` variable allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Visibility {
    /// Unset: every device.
    All,
    /// Set to nothing usable (empty, or starting with an invalid/negative index): no device.
    Hidden,
    /// An explicit list (indices or UUIDs); the runtime itself applies it.
    Only(Vec<String>),
}

impl Visibility {
    /// Parses a `HIP_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES` value the way the runtimes do:
    /// comma-separated entries, and the list ends at the first negative index (so `-1` hides
    /// every device).
    pub fn parse(value: Option<&str>) -> Visibility {
        let Some(value) = value else {
            return Visibility::All;
        };
        let mut entries = Vec::new();
        for entry in value.split(',').map(str::trim) {
            if entry.is_empty() {
                break;
            }
            if let Ok(index) = entry.parse::<i64>() {
                if index < 0 {
                    break;
                }
            }
            entries.push(entry.to_string());
        }
        if entries.is_empty() {
            Visibility::Hidden
        } else {
            Visibility::Only(entries)
        }
    }

    /// Reads and parses an environment variable.
    pub fn from_env(var: &str) -> Visibility {
        Visibility::parse(std::env::var(var).ok().as_deref())
    }

    /// True when no device can be visible.
    pub fn hides_all(&self) -> bool {
        matches!(self, Visibility::Hidden)
    }
}

/// The result of platform detection, with the reasons other platforms were not chosen.
pub struct Platform {
    kind: PlatformKind,
    api: Option<&'static dyn GpuApi>,
    device_count: i32,
    notes: Vec<String>,
}

impl fmt::Debug for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Platform")
            .field("kind", &self.kind)
            .field("device_count", &self.device_count)
            .field("notes", &self.notes)
            .finish()
    }
}

/// Loaded once per process and kept (the runtimes are not designed to be unloaded).
fn hip_api() -> std::result::Result<&'static HipApi, String> {
    static HIP: OnceLock<std::result::Result<&'static HipApi, String>> = OnceLock::new();
    HIP.get_or_init(|| HipApi::load().map(|api| &*Box::leak(Box::new(api))))
        .clone()
}

fn cuda_api() -> std::result::Result<&'static CudaApi, String> {
    static CUDA: OnceLock<std::result::Result<&'static CudaApi, String>> = OnceLock::new();
    CUDA.get_or_init(|| CudaApi::load().map(|api| &*Box::leak(Box::new(api))))
        .clone()
}

impl Platform {
    /// Detects the platform once per process (later calls return the same answer).
    ///
    /// AMD is tried first, then NVIDIA. A platform counts only if its library loads, the runtime
    /// initialises and it reports at least one device. `HIP_VISIBLE_DEVICES` (AMD) and
    /// `CUDA_VISIBLE_DEVICES` (both; ROCm honours it too) that hide every device rule the
    /// platform out before any library is opened. Never panics.
    pub fn detect() -> &'static Platform {
        static PLATFORM: OnceLock<Platform> = OnceLock::new();
        PLATFORM.get_or_init(Self::detect_uncached)
    }

    fn detect_uncached() -> Platform {
        let mut notes = Vec::new();
        // A malformed value forces no platform, with the reason in the notes (a program's
        // start-up check has refused it before this, with the same message).
        let forced = match crate::knobs::PLATFORM.read() {
            Ok(forced) => {
                if let Some(f) = forced {
                    notes.push(format!("{}={}", crate::knobs::PLATFORM.name, f.name()));
                }
                forced
            }
            Err(e) => {
                notes.push(e.to_string());
                Some(ForcedPlatform::None)
            }
        };
        let want = |name: &str| forced.is_none_or(|f| f.name() == name);
        let cuda_visible = Visibility::from_env("CUDA_VISIBLE_DEVICES");
        let hip_visible = Visibility::from_env("HIP_VISIBLE_DEVICES");

        if want("amd") {
            if hip_visible.hides_all() || cuda_visible.hides_all() {
                notes
                    .push("AMD: HIP_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES hide every device".into());
            } else {
                match hip_api() {
                    Err(e) => notes.push(format!("AMD: {e}")),
                    Ok(api) => match api.device_count() {
                        Ok(n) if n > 0 => return Self::found(PlatformKind::Amd, api, n, notes),
                        Ok(_) => notes.push("AMD: HIP runtime loaded but reports no device".into()),
                        Err(e) => notes.push(format!("AMD: {e}")),
                    },
                }
            }
        }
        if want("nvidia") {
            if cuda_visible.hides_all() {
                notes.push("NVIDIA: CUDA_VISIBLE_DEVICES hides every device".into());
            } else {
                match cuda_api() {
                    Err(e) => notes.push(format!("NVIDIA: {e}")),
                    Ok(api) => match api.device_count() {
                        Ok(n) if n > 0 => return Self::found(PlatformKind::Nvidia, api, n, notes),
                        Ok(_) => notes.push("NVIDIA: driver loaded but reports no device".into()),
                        Err(e) => notes.push(format!("NVIDIA: {e}")),
                    },
                }
            }
        }
        Platform {
            kind: PlatformKind::None,
            api: None,
            device_count: 0,
            notes,
        }
    }

    fn found(
        kind: PlatformKind,
        api: &'static dyn GpuApi,
        device_count: i32,
        notes: Vec<String>,
    ) -> Platform {
        Platform {
            kind,
            api: Some(api),
            device_count,
            notes,
        }
    }

    /// AMD, NVIDIA or none.
    pub fn kind(&self) -> PlatformKind {
        self.kind
    }

    /// Number of visible devices (0 when none).
    pub fn device_count(&self) -> usize {
        self.device_count.max(0) as usize
    }

    /// Why the platforms that were not chosen were ruled out (library missing, no device, …).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Why no GPU can be used, or `None` when one can: what was probed on each platform and why
    /// it failed (library missing, driver too old, runtime initialisation error, no device,
    /// devices hidden by `*_VISIBLE_DEVICES`). For messages such as "GPU present but unusable".
    pub fn unusable_reason(&self) -> Option<String> {
        if self.kind != PlatformKind::None {
            return None;
        }
        Some(if self.notes.is_empty() {
            "no GPU platform was probed".to_string()
        } else {
            self.notes.join("; ")
        })
    }

    /// Runtime and driver versions, or `None` without a platform.
    pub fn version(&self) -> Option<String> {
        self.api.map(|api| api.version_string())
    }

    /// The device with this (visible) ordinal.
    pub fn device(&self, ordinal: usize) -> Result<Device> {
        let Some(api) = self.api else {
            return Err(HipError::host(
                "Platform::device",
                ErrorKind::NoDevice,
                format!(
                    "no GPU platform was found ({}); install ROCm (AMD) or the NVIDIA driver, \
                     and check HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES",
                    self.notes.join("; ")
                ),
            ));
        };
        if ordinal >= self.device_count() {
            return Err(HipError::host(
                "Platform::device",
                ErrorKind::InvalidArgument,
                format!(
                    "device {ordinal} requested but only {} visible",
                    self.device_count
                ),
            ));
        }
        Ok(Device::new(api, ordinal as i32, self.kind))
    }

    /// The first device, when there is one; otherwise the reason there is none.
    pub fn default_device() -> std::result::Result<Device, String> {
        let platform = Self::detect();
        platform
            .device(0)
            .map_err(|e| e.detail.clone().unwrap_or_else(|| e.to_string()))
    }
}
