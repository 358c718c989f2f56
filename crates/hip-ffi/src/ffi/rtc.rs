//! The run-time compilers: hiprtc (AMD) and NVRTC (NVIDIA), loaded without touching a GPU.
//!
//! Neither library needs a device, `hipInit` or `cuInit`, so kernels can be compiled (and
//! compile errors caught) on a machine without a GPU. Each library is opened at most once per
//! process and kept loaded (compilers are not designed to be unloaded, and code compiled by
//! them may still reference their builtins).
//!
//! * hiprtc: `libhiprtc.so*` (its own library since ROCm 5.3), then `libamdhip64.so*` (which
//!   carried hiprtc before that; Debian bookworm's ROCm 5.2 `libamdhip64.so.5` does), each by
//!   name and under `$HIP_PATH/lib`, `$ROCM_PATH/lib`, `/opt/rocm/lib`; through the bindgen
//!   loader in [`crate::sys::rtc`].
//! * NVRTC: `$HIPDECODE_NVRTC_PATH` (a file, or a folder holding `libnvrtc.so*`) when set and
//!   nothing else; otherwise the loader's search by name, then CUDA toolkit folders and the
//!   `nvidia/*/lib` folders of pip's `nvidia-cuda-nvrtc` wheels. Called through function pointers
//!   looked up here whose status type is a plain integer, so a status value newer than these
//!   bindings can never be an invalid enum.

use super::c_string;
use super::library_search::{nvidia_library_dirs, rocm_library_candidates};
use crate::error::{Api, ErrorKind, HipError, Result};
use crate::platform_kind::PlatformKind;
use crate::sys::rtc as hiprtc;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The variable naming the NVRTC library file, or a folder that holds it.
const NVRTC_PATH_VAR: &str = crate::knobs::NVRTC_PATH.name;

type NvrtcProgram = *mut c_void;
/// `nvrtcResult` is a C enum; read as an integer (0 is success).
type NvrtcStatus = c_int;

/// The NVRTC entry points this crate calls, looked up once.
struct Nvrtc {
    _library: libloading::Library,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcStatus,
    error_string: unsafe extern "C" fn(NvrtcStatus) -> *const c_char,
    create_program: unsafe extern "C" fn(
        *mut NvrtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcStatus,
    destroy_program: unsafe extern "C" fn(*mut NvrtcProgram) -> NvrtcStatus,
    compile_program: unsafe extern "C" fn(NvrtcProgram, c_int, *const *const c_char) -> NvrtcStatus,
    log_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcStatus,
    log: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcStatus,
    cubin_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcStatus,
    cubin: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcStatus,
}

/// A loaded run-time compiler.
pub(crate) struct RtcLibrary {
    kind: RtcKind,
    /// The file it was loaded from (resolved to the real file when possible).
    path: PathBuf,
}

enum RtcKind {
    Hip(hiprtc::HipRtc),
    Nvrtc(Nvrtc),
}

/// The compiler of `platform`, loaded on first use and kept for the process's lifetime.
pub(crate) fn library(platform: PlatformKind) -> Result<&'static RtcLibrary> {
    static HIP: OnceLock<std::result::Result<&'static RtcLibrary, String>> = OnceLock::new();
    static NVRTC: OnceLock<std::result::Result<&'static RtcLibrary, String>> = OnceLock::new();
    let leak = |lib: RtcLibrary| &*Box::leak(Box::new(lib));
    let loaded = match platform {
        PlatformKind::Amd => HIP.get_or_init(|| load_hiprtc().map(leak)),
        PlatformKind::Nvidia => NVRTC.get_or_init(|| load_nvrtc().map(leak)),
        PlatformKind::None => {
            return Err(HipError::host(
                "rtc::Compiler::load",
                ErrorKind::InvalidArgument,
                "there is no run-time compiler for PlatformKind::None; ask for Amd or Nvidia",
            ))
        }
    };
    loaded
        .clone()
        .map_err(|reason| HipError::host("rtc::Compiler::load", ErrorKind::NotSupported, reason))
}

fn load_hiprtc() -> std::result::Result<RtcLibrary, String> {
    let candidates = rocm_library_candidates("libhiprtc")
        .into_iter()
        .chain(rocm_library_candidates("libamdhip64"));
    let mut tried = Vec::new();
    for candidate in candidates {
        // SAFETY: opening a ROCm library runs its initialisers, which is how it is meant to be
        // used; the loader struct only looks symbols up (no hipInit is called).
        match unsafe { hiprtc::HipRtc::new(&candidate) } {
            Ok(lib) if lib.hiprtcCompileProgram.is_ok() && lib.hiprtcGetCode.is_ok() => {
                return Ok(RtcLibrary {
                    path: resolve_loaded(&candidate),
                    kind: RtcKind::Hip(lib),
                });
            }
            Ok(_) => tried.push(format!("{} (no hiprtc symbols)", candidate.display())),
            Err(_) => {}
        }
    }
    Err(format!(
        "hiprtc not found: no libhiprtc.so* and no libamdhip64.so* carrying hiprtc on the loader \
         path or under $HIP_PATH/lib, $ROCM_PATH/lib, /opt/rocm/lib{}; install ROCm's hiprtc \
         (e.g. Debian: libamdhip64-5 libhiprtc-builtins5 libamd-comgr2 rocm-device-libs)",
        if tried.is_empty() {
            String::new()
        } else {
            format!(" ({})", tried.join(", "))
        }
    ))
}

/// NVRTC file names, newest first; the bare `libnvrtc.so` comes from a toolkit's dev package.
fn nvrtc_names() -> Vec<String> {
    let mut names = vec!["libnvrtc.so".to_string()];
    for major in (11..=14).rev() {
        names.push(format!("libnvrtc.so.{major}"));
    }
    names
}

/// NVRTC candidates: the override alone when set, else names, then well-known folders.
fn nvrtc_candidates(override_path: Option<&Path>) -> std::result::Result<Vec<PathBuf>, String> {
    if let Some(path) = override_path {
        if path.is_file() {
            return Ok(vec![path.to_path_buf()]);
        }
        if path.is_dir() {
            let found: Vec<PathBuf> = nvrtc_names()
                .iter()
                .map(|n| path.join(n))
                .filter(|p| p.is_file())
                .collect();
            if found.is_empty() {
                return Err(format!(
                    "{NVRTC_PATH_VAR}={} is a folder without libnvrtc.so or libnvrtc.so.<major>",
                    path.display()
                ));
            }
            return Ok(found);
        }
        return Err(format!(
            "{NVRTC_PATH_VAR}={} does not exist; point it at libnvrtc.so.<major> or its folder",
            path.display()
        ));
    }
    let names = nvrtc_names();
    let mut out: Vec<PathBuf> = names.iter().map(PathBuf::from).collect();
    for dir in nvidia_library_dirs() {
        for name in &names {
            let path = dir.join(name);
            if path.is_file() {
                out.push(path);
            }
        }
    }
    Ok(out)
}

fn load_nvrtc() -> std::result::Result<RtcLibrary, String> {
    let override_path = crate::knobs::NVRTC_PATH
        .read()
        .map_err(|e| e.to_string())?
        .map(PathBuf::from);
    let candidates = nvrtc_candidates(override_path.as_deref())?;
    let mut problems = Vec::new();
    for candidate in &candidates {
        // SAFETY: opening NVRTC runs its initialisers, which is how it is meant to be used.
        let Ok(library) = (unsafe { libloading::Library::new(candidate) }) else {
            continue;
        };
        match Nvrtc::bind(library) {
            Ok(nvrtc) => {
                return Ok(RtcLibrary {
                    path: resolve_loaded(candidate),
                    kind: RtcKind::Nvrtc(nvrtc),
                })
            }
            Err(missing) => problems.push(format!("{} lacks {missing}", candidate.display())),
        }
    }
    Err(format!(
        "NVRTC not found (tried {} candidates{}); install it (pip install nvidia-cuda-nvrtc, or \
         the CUDA toolkit's cuda-nvrtc package) and set {NVRTC_PATH_VAR} to the library or its \
         folder if it is not on the loader path",
        candidates.len(),
        if problems.is_empty() {
            String::new()
        } else {
            format!(": {}", problems.join(", "))
        }
    ))
}

impl Nvrtc {
    /// Looks up every entry point; the error names the first missing one.
    fn bind(library: libloading::Library) -> std::result::Result<Nvrtc, &'static str> {
        macro_rules! symbol {
            ($name:literal) => {
                // SAFETY: the symbol's type is the one in NVRTC's header (`nvrtc.h`), with the
                // C enum `nvrtcResult` read as `int`; the library is kept in the struct, so the
                // copied pointer never outlives it.
                *unsafe { library.get(concat!($name, "\0").as_bytes()) }.map_err(|_| $name)?
            };
        }
        Ok(Nvrtc {
            version: symbol!("nvrtcVersion"),
            error_string: symbol!("nvrtcGetErrorString"),
            create_program: symbol!("nvrtcCreateProgram"),
            destroy_program: symbol!("nvrtcDestroyProgram"),
            compile_program: symbol!("nvrtcCompileProgram"),
            log_size: symbol!("nvrtcGetProgramLogSize"),
            log: symbol!("nvrtcGetProgramLog"),
            cubin_size: symbol!("nvrtcGetCUBINSize"),
            cubin: symbol!("nvrtcGetCUBIN"),
            _library: library,
        })
    }

    /// The single place where an `nvrtcResult` becomes a `HipError`.
    fn check(&self, op: &'static str, status: NvrtcStatus) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString returns a static string (or null) for any value.
        let ptr = unsafe { (self.error_string)(status) };
        let name = if ptr.is_null() {
            format!("nvrtcResult({status})")
        } else {
            // SAFETY: non-null, NUL-terminated, static.
            unsafe { CStr::from_ptr(ptr) }
                .to_string_lossy()
                .into_owned()
        };
        Err(HipError {
            op,
            code: status,
            name,
            api: Api::Cuda,
            kind: ErrorKind::Compile,
            detail: None,
        })
    }

    fn version(&self) -> String {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: plain out-parameters.
        match self.check("nvrtcVersion", unsafe {
            (self.version)(&mut major, &mut minor)
        }) {
            Ok(()) => format!("NVRTC {major}.{minor}"),
            Err(_) => "NVRTC (version unknown)".to_string(),
        }
    }

    fn compile(&self, source: &CStr, name: &CStr, options: &[*const c_char]) -> Result<Vec<u8>> {
        let mut prog: NvrtcProgram = std::ptr::null_mut();
        // SAFETY: both strings are NUL-terminated and outlive the call; no headers.
        self.check("nvrtcCreateProgram", unsafe {
            (self.create_program)(
                &mut prog,
                source.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        })?;
        let result = self.compile_created(prog, options);
        // SAFETY: `prog` was created above and is not used afterwards.
        let _ = unsafe { (self.destroy_program)(&mut prog) };
        result
    }

    fn compile_created(&self, prog: NvrtcProgram, options: &[*const c_char]) -> Result<Vec<u8>> {
        // SAFETY: `prog` is live; the option pointers are NUL-terminated and outlive the call.
        let compiled = self.check("nvrtcCompileProgram", unsafe {
            (self.compile_program)(prog, options.len() as c_int, options.as_ptr())
        });
        if let Err(e) = compiled {
            let log = self.program_log(prog);
            return Err(e.with_detail(log));
        }
        let mut size = 0usize;
        // SAFETY: `prog` is live and compiled; plain out-parameter.
        self.check("nvrtcGetCUBINSize", unsafe {
            (self.cubin_size)(prog, &mut size)
        })?;
        let mut image = vec![0u8; size];
        // SAFETY: the buffer holds the `size` bytes NVRTC asked for.
        self.check("nvrtcGetCUBIN", unsafe {
            (self.cubin)(prog, image.as_mut_ptr().cast())
        })?;
        Ok(image)
    }

    fn program_log(&self, prog: NvrtcProgram) -> String {
        let mut size = 0usize;
        // SAFETY: `prog` is live; plain out-parameter.
        if unsafe { (self.log_size)(prog, &mut size) } != 0 {
            return "(no compiler log)".to_string();
        }
        let mut log = vec![0u8; size.max(1)];
        // SAFETY: the buffer holds the `size` bytes NVRTC asked for.
        if unsafe { (self.log)(prog, log.as_mut_ptr().cast()) } != 0 {
            return "(no compiler log)".to_string();
        }
        log_text(&log)
    }
}

/// Calls a looked-up hiprtc function and checks its status. Must be used inside `unsafe`.
macro_rules! call_hiprtc {
    ($lib:expr, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $lib.$f.as_ref() {
            Ok(f) => check_hiprtc($lib, stringify!($f), (*f)($($arg),*) as i32),
            Err(_) => Err(HipError::host(
                stringify!($f),
                ErrorKind::NotSupported,
                "the installed hiprtc does not export this function",
            )),
        }
    };
}

/// The single place where a `hiprtcResult` becomes a `HipError`.
fn check_hiprtc(lib: &hiprtc::HipRtc, op: &'static str, code: i32) -> Result<()> {
    if code == hiprtc::HIPRTC_SUCCESS as i32 {
        return Ok(());
    }
    let name = match lib.hiprtcGetErrorString.as_ref() {
        // SAFETY: returns a static string (or null) for any code.
        Ok(f) => unsafe {
            let ptr = (*f)(code as hiprtc::hiprtcResult);
            if ptr.is_null() {
                format!("hiprtcResult({code})")
            } else {
                CStr::from_ptr(ptr).to_string_lossy().into_owned()
            }
        },
        Err(_) => format!("hiprtcResult({code})"),
    };
    Err(HipError {
        op,
        code,
        name,
        api: Api::Hip,
        kind: ErrorKind::Compile,
        detail: None,
    })
}

fn hiprtc_version(lib: &hiprtc::HipRtc) -> String {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters.
    match unsafe { call_hiprtc!(lib, hiprtcVersion(&mut major, &mut minor)) } {
        Ok(()) => format!("hiprtc {major}.{minor}"),
        Err(_) => "hiprtc (version unknown)".to_string(),
    }
}

fn hiprtc_compile(
    lib: &hiprtc::HipRtc,
    source: &CStr,
    name: &CStr,
    options: &[*const c_char],
) -> Result<Vec<u8>> {
    let mut prog: hiprtc::hiprtcProgram = std::ptr::null_mut();
    // SAFETY: both strings are NUL-terminated and outlive the call; no headers.
    unsafe {
        call_hiprtc!(
            lib,
            hiprtcCreateProgram(
                &mut prog,
                source.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        )
    }?;
    // hiprtc's signature takes `char**` but does not write through it.
    let mut option_ptrs = options.to_vec();
    // SAFETY: `prog` is live until the destroy below; the options outlive the call.
    let result = unsafe {
        match call_hiprtc!(
            lib,
            hiprtcCompileProgram(prog, option_ptrs.len() as i32, option_ptrs.as_mut_ptr())
        ) {
            Err(e) => Err(e.with_detail(hiprtc_log(lib, prog))),
            Ok(()) => {
                let mut size = 0usize;
                call_hiprtc!(lib, hiprtcGetCodeSize(prog, &mut size)).and_then(|()| {
                    let mut image = vec![0u8; size];
                    call_hiprtc!(lib, hiprtcGetCode(prog, image.as_mut_ptr().cast()))
                        .map(|()| image)
                })
            }
        }
    };
    // SAFETY: `prog` is live and not used afterwards.
    let _ = unsafe { call_hiprtc!(lib, hiprtcDestroyProgram(&mut prog)) };
    result
}

/// The hiprtc compile log, for error messages.
///
/// # Safety
/// `prog` is a live program of `lib`.
unsafe fn hiprtc_log(lib: &hiprtc::HipRtc, prog: hiprtc::hiprtcProgram) -> String {
    let mut size = 0usize;
    // SAFETY: the caller guarantees `prog` is live.
    if unsafe { call_hiprtc!(lib, hiprtcGetProgramLogSize(prog, &mut size)) }.is_err() {
        return "(no compiler log)".to_string();
    }
    let mut log = vec![0u8; size.max(1)];
    // SAFETY: the buffer holds `size` bytes as hiprtc asked.
    if unsafe { call_hiprtc!(lib, hiprtcGetProgramLog(prog, log.as_mut_ptr().cast())) }.is_err() {
        return "(no compiler log)".to_string();
    }
    log_text(&log)
}

fn log_text(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw)
        .trim_end_matches('\0')
        .trim()
        .to_string();
    if text.is_empty() {
        "(empty compiler log)".to_string()
    } else {
        text
    }
}

impl RtcLibrary {
    /// Compiler name, version and the file it came from, e.g.
    /// `hiprtc 5.2 (/usr/lib/x86_64-linux-gnu/libamdhip64.so.5.2.21153)`.
    pub(crate) fn version(&self) -> String {
        let name = match &self.kind {
            RtcKind::Hip(lib) => hiprtc_version(lib),
            RtcKind::Nvrtc(lib) => lib.version(),
        };
        format!("{name} ({})", self.path.display())
    }

    /// Compiles `source` with exactly `options` and returns the code object (HSACO or CUBIN);
    /// a failed compile carries the compiler log in its detail.
    pub(crate) fn compile(&self, source: &str, name: &str, options: &[String]) -> Result<Vec<u8>> {
        let op = match self.kind {
            RtcKind::Hip(_) => "hiprtcCompileProgram",
            RtcKind::Nvrtc(_) => "nvrtcCompileProgram",
        };
        let c_source = c_string(op, "kernel source", source)?;
        let c_name = c_string(op, "program name", name)?;
        let c_options = options
            .iter()
            .map(|o| c_string(op, "compile option", o))
            .collect::<Result<Vec<_>>>()?;
        let option_ptrs: Vec<*const c_char> = c_options.iter().map(|o| o.as_ptr()).collect();
        let image = match &self.kind {
            RtcKind::Hip(lib) => hiprtc_compile(lib, &c_source, &c_name, &option_ptrs),
            RtcKind::Nvrtc(lib) => lib.compile(&c_source, &c_name, &option_ptrs),
        }?;
        if image.is_empty() {
            return Err(HipError::host(
                op,
                ErrorKind::Compile,
                format!("`{name}` compiled to an empty code object"),
            ));
        }
        Ok(image)
    }
}

/// The real file behind a library opened as `candidate`: itself when it is a path, else the
/// mapped file whose name starts with it (from `/proc/self/maps`), else the name as given.
fn resolve_loaded(candidate: &Path) -> PathBuf {
    if candidate.components().count() > 1 {
        return std::fs::canonicalize(candidate).unwrap_or_else(|_| candidate.to_path_buf());
    }
    let Some(stem) = candidate.to_str() else {
        return candidate.to_path_buf();
    };
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return candidate.to_path_buf();
    };
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .map(Path::new)
        .find(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(stem))
        })
        .map(Path::to_path_buf)
        .unwrap_or_else(|| candidate.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvrtc_override_must_exist_and_hold_the_library() {
        let missing = nvrtc_candidates(Some(Path::new("/no/such/nvrtc/dir")))
            .expect_err("a missing override is an error, not a fallback");
        assert!(missing.contains(NVRTC_PATH_VAR) && missing.contains("does not exist"));

        let empty = std::env::temp_dir().join(format!("hip-ffi-nvrtc-{}", std::process::id()));
        std::fs::create_dir_all(&empty).expect("mkdir");
        let err = nvrtc_candidates(Some(&empty)).expect_err("empty folder");
        assert!(err.contains("without libnvrtc.so"), "{err}");
        std::fs::write(empty.join("libnvrtc.so.13"), b"").expect("write");
        let found = nvrtc_candidates(Some(&empty)).expect("found");
        assert_eq!(found, vec![empty.join("libnvrtc.so.13")]);
        let _ = std::fs::remove_dir_all(&empty);
    }

    #[test]
    fn an_empty_log_says_so() {
        assert_eq!(log_text(b"\0"), "(empty compiler log)");
        assert_eq!(log_text(b"error: x\n\0"), "error: x");
    }
}
