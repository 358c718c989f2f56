//! NCCL (NVIDIA) or RCCL (AMD), loaded at run time: the two share one C API, so one set of
//! entry points serves both. A machine without either gets a reason that names what was tried
//! and how to install it, never a panic; a program without tensor parallelism never loads it.
//!
//! This module holds every raw entry point and reads every result ([`Library::check`]); the
//! device communicator ([`crate::device`]) is written over [`Entries`].

use crate::CollectiveError;
use std::ffi::{c_char, c_int, c_void, CStr};

/// Which library answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    Nccl,
    Rccl,
}

/// The names tried, in order: the system's NCCL (also what the `nvidia-nccl-cu13` wheel puts on
/// `LD_LIBRARY_PATH`), then ROCm's RCCL.
const CANDIDATES: [(&str, Vendor); 4] = [
    ("libnccl.so.2", Vendor::Nccl),
    ("libnccl.so", Vendor::Nccl),
    ("librccl.so.1", Vendor::Rccl),
    ("librccl.so", Vendor::Rccl),
];

/// The environment NCCL must run with here: NVLink multicast (NVLS) stays off.
pub const NCCL_ENVIRONMENT: (&str, &str) = ("NCCL_NVLS_ENABLE", "0");

/// `ncclResult_t ncclGetVersion(int* version)`.
type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;

/// `ncclUniqueId`: 128 opaque bytes (nccl.h's `NCCL_UNIQUE_ID_BYTES`), passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RawUniqueId {
    pub internal: [c_char; 128],
}

/// An `ncclComm_t`.
pub type RawComm = *mut c_void;

/// `ncclFloat32` of `ncclDataType_t`.
pub const NCCL_FLOAT32: c_int = 7;
/// `ncclSum` of `ncclRedOp_t`.
pub const NCCL_SUM: c_int = 0;

/// The communicator's entry points, with nccl.h's signatures (RCCL's take a `hipStream_t` where
/// NCCL's take a `cudaStream_t`: both are the runtime's stream handle).
#[derive(Clone, Copy)]
pub struct Entries {
    pub get_unique_id: unsafe extern "C" fn(*mut RawUniqueId) -> c_int,
    pub comm_init_rank: unsafe extern "C" fn(*mut RawComm, c_int, RawUniqueId, c_int) -> c_int,
    pub all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        *mut c_void,
    ) -> c_int,
    pub all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        RawComm,
        *mut c_void,
    ) -> c_int,
    pub comm_get_async_error: unsafe extern "C" fn(RawComm, *mut c_int) -> c_int,
    pub comm_abort: unsafe extern "C" fn(RawComm) -> c_int,
    pub comm_destroy: unsafe extern "C" fn(RawComm) -> c_int,
    pub get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
}

/// A loaded collective library.
pub struct Library {
    vendor: Vendor,
    name: &'static str,
    get_version: GetVersion,
    /// `None` with the reason when the library lacks one of them (a version before the
    /// asynchronous error query, 2.4).
    entries: Result<Entries, String>,
    /// Keeps the code the entry points point into loaded.
    _library: libloading::Library,
}

impl Library {
    /// Loads the first of NCCL or RCCL the dynamic loader finds. Errors name every library
    /// tried and why it failed. NCCL is refused unless `NCCL_NVLS_ENABLE=0` is set: multicast
    /// must stay off before the library reads its environment.
    pub fn open() -> Result<Library, CollectiveError> {
        let mut tried = Vec::new();
        for (name, vendor) in CANDIDATES {
            // SAFETY: loading a shared library runs its initialisers; NCCL's and RCCL's only
            // set up their own state. The name is a fixed library name, not a path from input.
            match unsafe { libloading::Library::new(name) } {
                Ok(library) => return Library::with(library, name, vendor),
                Err(e) => tried.push(format!("{name} ({e})")),
            }
        }
        Err(CollectiveError::Library(format!(
            "no collective library found: tried {}. Tensor parallelism needs NCCL on NVIDIA \
             (the system's libnccl, or `pip install nvidia-nccl-cu13` with its lib folder on \
             LD_LIBRARY_PATH) or RCCL on AMD (ROCm's librccl)",
            tried.join(", ")
        )))
    }

    fn with(
        library: libloading::Library,
        name: &'static str,
        vendor: Vendor,
    ) -> Result<Library, CollectiveError> {
        let (key, value) = NCCL_ENVIRONMENT;
        // NCCL's own variable, read by name (not a HIPDECODE_ knob); NCCL_ENVIRONMENT names it.
        if vendor == Vendor::Nccl && std::env::var("NCCL_NVLS_ENABLE").as_deref() != Ok(value) {
            return Err(CollectiveError::Library(format!(
                "{name} was found, but {key} is not {value}: NVLink multicast must stay off; \
                 set {key}={value} in the environment of every process of the run"
            )));
        }
        // SAFETY: `ncclGetVersion` has this signature in NCCL and RCCL alike (nccl.h); the
        // pointer is kept with the library that holds its code.
        let get_version = unsafe { library.get::<GetVersion>(b"ncclGetVersion\0") }
            .map(|f| *f)
            .map_err(|e| CollectiveError::Library(format!("{name} has no ncclGetVersion: {e}")))?;
        let entries = load_entries(&library, name);
        Ok(Library {
            vendor,
            name,
            get_version,
            entries,
            _library: library,
        })
    }

    /// The communicator's entry points, or why the library lacks them.
    pub fn entries(&self) -> Result<Entries, CollectiveError> {
        self.entries.clone().map_err(CollectiveError::Library)
    }

    /// `result` of `call`, with the library's own words for a failure.
    pub fn check(&self, call: &str, result: c_int) -> Result<(), CollectiveError> {
        check(self.name, call, result).map_err(|e| match &self.entries {
            Ok(entries) if result != 0 => {
                // SAFETY: ncclGetErrorString takes any result code and returns a static
                // NUL-terminated string (or null, checked).
                let text = unsafe { (entries.get_error_string)(result) };
                if text.is_null() {
                    return e;
                }
                // SAFETY: non-null, NUL-terminated and static, as above.
                let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
                CollectiveError::Library(format!("{e}: {text}"))
            }
            _ => e,
        })
    }

    pub fn vendor(&self) -> Vendor {
        self.vendor
    }

    /// The file name the library was loaded by.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The library's version as (major, minor, patch).
    pub fn version(&self) -> Result<(u32, u32, u32), CollectiveError> {
        let mut code: c_int = 0;
        // SAFETY: `get_version` came from this loaded library and writes one int.
        let result = unsafe { (self.get_version)(&mut code) };
        check(self.name, "ncclGetVersion", result)?;
        Ok(split_version(code))
    }
}

/// Every communicator entry point of `library`, or the first one missing.
fn load_entries(library: &libloading::Library, name: &str) -> Result<Entries, String> {
    macro_rules! entry {
        ($symbol:literal) => {
            // SAFETY: each symbol is declared in Entries with nccl.h's signature, which RCCL
            // shares; the pointer is kept with the library that holds its code.
            unsafe { library.get(concat!($symbol, "\0").as_bytes()) }
                .map(|f| *f)
                .map_err(|e| format!("{name} has no {}: {e}", $symbol))?
        };
    }
    Ok(Entries {
        get_unique_id: entry!("ncclGetUniqueId"),
        comm_init_rank: entry!("ncclCommInitRank"),
        all_reduce: entry!("ncclAllReduce"),
        all_gather: entry!("ncclAllGather"),
        comm_get_async_error: entry!("ncclCommGetAsyncError"),
        comm_abort: entry!("ncclCommAbort"),
        comm_destroy: entry!("ncclCommDestroy"),
        get_error_string: entry!("ncclGetErrorString"),
    })
}

/// NCCL's version code: major * 10000 + minor * 100 + patch from 2.9 on, major * 1000 + minor
/// * 100 + patch before.
fn split_version(code: c_int) -> (u32, u32, u32) {
    let code = code.max(0) as u32;
    if code >= 10_000 {
        (code / 10_000, code % 10_000 / 100, code % 100)
    } else {
        (code / 1000, code % 1000 / 100, code % 100)
    }
}

/// The one place a library result is read: `ncclSuccess` (0) or an error that names the call.
fn check(library: &str, call: &str, result: c_int) -> Result<(), CollectiveError> {
    match result {
        0 => Ok(()),
        code => Err(CollectiveError::Library(format!(
            "{library}: {call} failed with ncclResult_t {code} ({})",
            match code {
                1 => "unhandled CUDA or HIP error",
                2 => "system error",
                3 => "internal error",
                4 => "invalid argument",
                5 => "invalid usage",
                6 => "remote error",
                7 => "in progress",
                _ => "unknown code",
            }
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_of_both_eras_split() {
        assert_eq!(split_version(22_805), (2, 28, 5));
        assert_eq!(split_version(2804), (2, 8, 4));
    }

    #[test]
    fn a_failed_call_is_named_with_its_code() {
        assert!(check("libnccl.so.2", "ncclGetVersion", 0).is_ok());
        let e = check("libnccl.so.2", "ncclAllReduce", 4)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ncclAllReduce") && e.contains("invalid argument"),
            "{e}"
        );
    }

    /// Where neither library is installed (this project's CI), opening says what was tried
    /// and how to get one; where one is, it reports a 2.x version.
    #[test]
    fn opening_gives_a_library_or_a_reason_never_a_panic() {
        match Library::open() {
            Ok(lib) => {
                let (major, _, _) = lib.version().expect("the version");
                assert_eq!(major, 2, "{} {:?}", lib.name(), lib.vendor());
            }
            Err(e) => {
                let e = e.to_string();
                assert!(
                    (e.contains("libnccl.so.2") && e.contains("librccl.so"))
                        || e.contains("NCCL_NVLS_ENABLE"),
                    "{e}"
                );
            }
        }
    }
}
