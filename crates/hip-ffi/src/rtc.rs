//! Run-time kernel compilation without a GPU: hiprtc (AMD) or NVRTC (NVIDIA).
//!
//! [`Compiler::load`] opens the platform's compiler library only; it needs no device and never
//! calls `hipInit`/`cuInit`, so CI machines without a GPU can compile every kernel for every
//! target architecture, and a kernel disk cache can key its entries on [`Compiler::version`].
//! [`crate::Device::compile`] goes through the same code, with the device's architecture and
//! warp size.
//!
//! Where the libraries are looked for:
//! * AMD: `libhiprtc.so*` (ROCm 5.3 and later ship hiprtc on its own), then `libamdhip64.so*`
//!   (which carried hiprtc before; Debian bookworm's ROCm 5.2 `libamdhip64.so.5` does, and then
//!   also needs `libhiprtc-builtins5`, `libamd-comgr2` and `rocm-device-libs`), each by name and
//!   under `$HIP_PATH/lib`, `$ROCM_PATH/lib` and `/opt/rocm/lib`.
//! * NVIDIA: the file or folder in `HIPDECODE_NVRTC_PATH` when that is set (and then nothing
//!   else), otherwise `libnvrtc.so*` by name, then under `$CUDA_HOME/lib64`, `$CUDA_PATH/lib64`,
//!   `/usr/local/cuda`, and the `nvidia/{cu13,cu12,cuda_nvrtc}/lib` folders of pip's
//!   `nvidia-cuda-nvrtc` wheels (system, user, virtual/conda environment and pyenv installs).
//!
//! **Known crash:** hiprtc 5.2 aborts the whole process (`munmap_chunk(): invalid pointer`)
//! when compiling for gfx940, gfx941, gfx942 or gfx1100, targets it does not know well. Callers
//! that compile for such targets with an old hiprtc (e.g. CI compile checks) must do it in a
//! child process and treat its abnormal exit as "this compiler cannot target that arch".

use crate::error::{ErrorKind, HipError, Result};
use crate::ffi::rtc::{self as raw, RtcLibrary};
use crate::platform_kind::PlatformKind;

/// A loaded run-time compiler. Cheap to copy; usable from any thread (each compile is its own
/// program). The library stays loaded for the rest of the process.
#[derive(Clone, Copy)]
pub struct Compiler {
    platform: PlatformKind,
    library: &'static RtcLibrary,
}

impl std::fmt::Debug for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiler")
            .field("platform", &self.platform)
            .field("version", &self.version())
            .finish()
    }
}

/// The target options the compilers get: `--offload-arch=<gfx…>` (hiprtc) or
/// `--gpu-architecture=<sm_XX>` (NVRTC) when the architecture is known, and always
/// `-DWARP_SIZE=<wave_size>`, so kernel sources never hard-code 32 or 64.
pub fn target_options(platform: PlatformKind, arch: Option<&str>, wave_size: u32) -> Vec<String> {
    let mut options = Vec::new();
    match (platform, arch) {
        (PlatformKind::Amd, Some(arch)) => options.push(format!("--offload-arch={arch}")),
        (PlatformKind::Nvidia, Some(arch)) => options.push(format!("--gpu-architecture={arch}")),
        // Without a known gfx name hiprtc targets the current device by itself.
        (PlatformKind::Amd | PlatformKind::Nvidia, None) | (PlatformKind::None, _) => {}
    }
    options.push(format!("-DWARP_SIZE={wave_size}"));
    options
}

/// Checks an architecture name and wave size against the platform before a compiler sees them
/// (a typo such as `sm90` or `gfx90a` given to NVRTC would otherwise surface as an obscure
/// compiler failure).
fn check_target(platform: PlatformKind, arch: &str, wave_size: u32) -> Result<()> {
    let fail = |detail: String| {
        Err(HipError::host(
            "rtc::Compiler::compile",
            ErrorKind::InvalidArgument,
            detail,
        ))
    };
    let name_ok = |prefix: &str| {
        arch.strip_prefix(prefix).is_some_and(|rest| {
            rest.starts_with(|c: char| c.is_ascii_digit())
                && rest
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '+' | '-' | '_'))
        })
    };
    match platform {
        PlatformKind::Amd => {
            if !name_ok("gfx") {
                return fail(format!(
                    "`{arch}` is not an AMD architecture; use a gfx name such as gfx90a or gfx1151"
                ));
            }
            if wave_size != 32 && wave_size != 64 {
                return fail(format!(
                    "wave size {wave_size} is not possible on AMD; use 32 (RDNA) or 64 (CDNA/GCN)"
                ));
            }
        }
        PlatformKind::Nvidia => {
            if !name_ok("sm_") {
                return fail(format!(
                    "`{arch}` is not an NVIDIA architecture; use sm_<major><minor> such as sm_90"
                ));
            }
            if wave_size != 32 {
                return fail(format!(
                    "wave size {wave_size} is not possible on NVIDIA; use 32 (the warp size of every NVIDIA GPU)"
                ));
            }
        }
        PlatformKind::None => unreachable!("a Compiler always has a platform"),
    }
    Ok(())
}

impl Compiler {
    /// Loads the run-time compiler of `platform` (hiprtc for AMD, NVRTC for NVIDIA); needs no
    /// GPU. Loaded once per process: later calls return the same library (or the same error,
    /// which says where it looked and what to install).
    pub fn load(platform: PlatformKind) -> Result<Compiler> {
        let library = raw::library(platform)?;
        Ok(Compiler { platform, library })
    }

    /// The platform this compiler targets.
    pub fn platform(&self) -> PlatformKind {
        self.platform
    }

    /// The compiler's name, version and library file, e.g. `NVRTC 13.0
    /// (/…/nvidia/cu13/lib/libnvrtc.so.13)`; part of a compiled-kernel cache key, since a
    /// different compiler may produce different code.
    pub fn version(&self) -> String {
        self.library.version()
    }

    /// Compiles `source` for `arch` (`gfx90a`, `gfx1151`, `sm_90`, …) with `-DWARP_SIZE=
    /// <wave_size>`, followed by `extra_options`, and returns the code object (HSACO on AMD,
    /// CUBIN on NVIDIA). `name` is the program's file name in compiler messages. A failed
    /// compile is an [`ErrorKind::Compile`] error whose detail holds the compiler log; an
    /// architecture or wave size that does not fit the platform is refused before compiling.
    /// See the module docs for the hiprtc 5.2 crash on some gfx targets.
    pub fn compile(
        &self,
        source: &str,
        name: &str,
        arch: &str,
        wave_size: u32,
        extra_options: &[String],
    ) -> Result<Vec<u8>> {
        check_target(self.platform, arch, wave_size)?;
        self.compile_for(source, name, Some(arch), wave_size, extra_options)
    }

    /// Same as [`Compiler::compile`], but `arch: None` leaves the target to the compiler (hiprtc
    /// then compiles for the current device); used by [`crate::Device::compile`].
    pub(crate) fn compile_for(
        &self,
        source: &str,
        name: &str,
        arch: Option<&str>,
        wave_size: u32,
        extra_options: &[String],
    ) -> Result<Vec<u8>> {
        let mut options = target_options(self.platform, arch, wave_size);
        options.extend(extra_options.iter().cloned());
        self.library.compile(source, name, &options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_checked_against_the_platform() {
        assert!(check_target(PlatformKind::Amd, "gfx90a", 64).is_ok());
        assert!(check_target(PlatformKind::Amd, "gfx90a:xnack-", 64).is_ok());
        assert!(check_target(PlatformKind::Amd, "gfx1151", 32).is_ok());
        assert!(check_target(PlatformKind::Nvidia, "sm_90", 32).is_ok());
        assert!(check_target(PlatformKind::Nvidia, "sm_90a", 32).is_ok());
        for (platform, arch, wave) in [
            (PlatformKind::Amd, "sm_90", 64),
            (PlatformKind::Amd, "gfx", 64),
            (PlatformKind::Amd, "gfx90a", 48),
            (PlatformKind::Nvidia, "gfx90a", 32),
            (PlatformKind::Nvidia, "sm90", 32),
            (PlatformKind::Nvidia, "sm_90", 64),
            (PlatformKind::Nvidia, "sm_90 -O0", 32),
        ] {
            let err = check_target(platform, arch, wave).expect_err(arch);
            assert_eq!(err.kind, ErrorKind::InvalidArgument, "{arch}");
            assert!(err.to_string().contains("use "), "names the fix: {err}");
        }
    }

    #[test]
    fn options_carry_arch_and_warp_size() {
        assert_eq!(
            target_options(PlatformKind::Amd, Some("gfx1030"), 32),
            ["--offload-arch=gfx1030", "-DWARP_SIZE=32"]
        );
        assert_eq!(
            target_options(PlatformKind::Nvidia, Some("sm_90"), 32),
            ["--gpu-architecture=sm_90", "-DWARP_SIZE=32"]
        );
        assert_eq!(
            target_options(PlatformKind::Amd, None, 64),
            ["-DWARP_SIZE=64"]
        );
    }

    #[test]
    fn no_platform_has_no_compiler() {
        let err = Compiler::load(PlatformKind::None).expect_err("none");
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
    }
}
