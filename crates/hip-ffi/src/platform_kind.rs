//! [`PlatformKind`], the name of a GPU platform. A module of its own, below both the raw layer
//! (which picks each platform's libraries by it) and [`crate::platform`] (which detects one):
//! the raw layer may not import from the layers above it.

use std::fmt;

/// The kind of GPU platform found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlatformKind {
    /// AMD GPU through the HIP runtime (`libamdhip64`).
    Amd,
    /// NVIDIA GPU through the CUDA driver API (`libcuda`).
    Nvidia,
    /// No usable GPU.
    None,
}

impl fmt::Display for PlatformKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PlatformKind::Amd => "AMD (HIP)",
            PlatformKind::Nvidia => "NVIDIA (CUDA)",
            PlatformKind::None => "none",
        })
    }
}
