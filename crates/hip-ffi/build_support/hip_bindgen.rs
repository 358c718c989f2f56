//! The one bindgen configuration for the HIP bindings.
//!
//! Shared by `build.rs` (bindings generated from the HIP headers installed on the build machine)
//! and `cargo xtask bindgen` (the committed fallback in `src/sys/`), so the two can never drift
//! apart in what they expose. Everything is loaded at run time (`dynamic_library_name`), error
//! codes and other enums become plain integer constants (a newer runtime may return codes the
//! headers at build time did not know, which a Rust enum could not hold), and only the calls the
//! safe layer uses are allowed through. `hipDeviceProp_t` is deliberately absent: its layout
//! changed between ROCm 5 and 6, while `hipDeviceGetAttribute` is stable.

use std::path::{Path, PathBuf};

/// HIP runtime functions the safe layer calls (from `hip/hip_runtime_api.h`).
pub const RUNTIME_FUNCTIONS: &[&str] = &[
    "hipInit",
    "hipGetErrorName",
    "hipGetErrorString",
    "hipDriverGetVersion",
    "hipRuntimeGetVersion",
    "hipGetDeviceCount",
    "hipSetDevice",
    "hipDeviceGetName",
    "hipDeviceGetAttribute",
    "hipDeviceTotalMem",
    "hipDeviceSynchronize",
    "hipMemGetInfo",
    "hipMalloc",
    "hipFree",
    "hipMallocAsync",
    "hipFreeAsync",
    "hipMallocManaged",
    "hipMemset",
    "hipMemsetAsync",
    "hipMemcpy",
    "hipMemcpyAsync",
    "hipHostMalloc",
    "hipHostFree",
    "hipHostGetDevicePointer",
    "hipHostRegister",
    "hipHostUnregister",
    "hipStreamCreateWithFlags",
    "hipStreamDestroy",
    "hipStreamSynchronize",
    "hipStreamQuery",
    "hipStreamWaitEvent",
    "hipEventCreateWithFlags",
    "hipEventDestroy",
    "hipEventRecord",
    "hipEventQuery",
    "hipEventSynchronize",
    "hipEventElapsedTime",
    "hipModuleLoadData",
    "hipModuleUnload",
    "hipModuleGetFunction",
    "hipModuleLaunchKernel",
    "hipStreamBeginCapture",
    "hipStreamEndCapture",
    "hipStreamIsCapturing",
    "hipThreadExchangeStreamCaptureMode",
    "hipGraphDestroy",
    "hipGraphInstantiate",
    "hipGraphLaunch",
    "hipGraphExecDestroy",
];

/// Run-time compiler functions (from `hip/hiprtc.h`); a separate library since ROCm 5.3.
pub const RTC_FUNCTIONS: &[&str] = &[
    "hiprtcGetErrorString",
    "hiprtcVersion",
    "hiprtcCreateProgram",
    "hiprtcDestroyProgram",
    "hiprtcCompileProgram",
    "hiprtcGetProgramLogSize",
    "hiprtcGetProgramLog",
    "hiprtcGetCodeSize",
    "hiprtcGetCode",
];

/// Enums and flag macros whose values the safe layer needs, matched as regular expressions.
const RUNTIME_VARS: &[&str] = &[
    "hipSuccess",
    "hipError.*",
    "hipDeviceAttribute.*",
    "hipMemcpy(HostToHost|HostToDevice|DeviceToHost|DeviceToDevice|Default)",
    "hipStreamCaptureMode.*",
    "hipStreamCaptureStatus.*",
    "hipStreamNonBlocking",
    "hipEventDefault",
    "hipEventDisableTiming",
    "hipHostMalloc(Default|Mapped|Portable|Coherent|NonCoherent)",
    "hipHostRegister(Default|Mapped|Portable)",
    "hipMemAttachGlobal",
];

const RTC_VARS: &[&str] = &["HIPRTC_.*"];

/// Which of the two bindings files to produce.
#[derive(Clone, Copy, Debug)]
pub enum Library {
    /// `libamdhip64`, from `hip/hip_runtime_api.h`; the loader struct is `HipRuntime`.
    Runtime,
    /// `libhiprtc`, from `hip/hiprtc.h`; the loader struct is `HipRtc`.
    Rtc,
}

impl Library {
    /// The file name the bindings are written to.
    pub fn file_name(self) -> &'static str {
        match self {
            Library::Runtime => "hip_runtime.rs",
            Library::Rtc => "hiprtc.rs",
        }
    }
}

/// Candidate include directories holding `hip/hip_runtime_api.h`, in the order they are tried:
/// `$HIP_PATH/include`, `$ROCM_PATH/include`, `/opt/rocm/include`, then `/usr/include`
/// (Debian's `libamdhip64-dev` installs `/usr/include/hip`).
pub fn candidate_include_dirs(hip_path: Option<&str>, rocm_path: Option<&str>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for root in [hip_path, rocm_path].into_iter().flatten() {
        if !root.is_empty() {
            dirs.push(Path::new(root).join("include"));
        }
    }
    dirs.push(PathBuf::from("/opt/rocm/include"));
    dirs.push(PathBuf::from("/usr/include"));
    dirs
}

/// The first candidate directory that really holds the HIP runtime header.
pub fn find_include_dir(candidates: &[PathBuf]) -> Option<PathBuf> {
    candidates
        .iter()
        .find(|dir| dir.join("hip/hip_runtime_api.h").is_file())
        .cloned()
}

/// Generates one bindings file's text from the headers under `include_dir`.
///
/// bindgen panics when it cannot load libclang; the caller decides whether to catch that.
pub fn generate(include_dir: &Path, library: Library) -> Result<String, String> {
    let (header, struct_name, functions, vars) = match library {
        Library::Runtime => (
            "hip/hip_runtime_api.h",
            "HipRuntime",
            RUNTIME_FUNCTIONS,
            RUNTIME_VARS,
        ),
        Library::Rtc => ("hip/hiprtc.h", "HipRtc", RTC_FUNCTIONS, RTC_VARS),
    };
    let header_path = include_dir.join(header);
    let mut builder = bindgen::Builder::default()
        .header(header_path.to_string_lossy())
        .clang_arg(format!("-I{}", include_dir.display()))
        .clang_arg("-D__HIP_PLATFORM_AMD__")
        .clang_arg("-xc++")
        .clang_arg("-std=c++17")
        .dynamic_library_name(struct_name)
        .dynamic_link_require_all(false)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .allowlist_recursively(true)
        .formatter(bindgen::Formatter::Prettyplease);
    for f in functions {
        builder = builder.allowlist_function(f);
    }
    for v in vars {
        builder = builder.allowlist_var(v).allowlist_type(v);
    }
    builder = builder
        .allowlist_type("hipError_t")
        .allowlist_type("hipDeviceAttribute_t")
        .allowlist_type("hipMemcpyKind")
        .allowlist_type("hipStreamCaptureMode")
        .allowlist_type("hipStreamCaptureStatus")
        .allowlist_type("hiprtcResult");
    let bindings = builder
        .generate()
        .map_err(|e| format!("bindgen failed on {}: {e}", header_path.display()))?;
    // bindgen's loader passes a generic `P: AsRef<OsStr>` to `Library::new`, which libloading
    // 0.9 no longer accepts (it wants a concrete `AsFilename` type); `&OsStr` is one.
    let text = bindings.to_string().replace(
        "::libloading::Library::new(path)",
        "::libloading::Library::new(path.as_ref())",
    );
    Ok(text)
}
