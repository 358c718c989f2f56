//! The vendor GEMM library, loaded at run time: cuBLASLt on NVIDIA, hipBLASLt on AMD.
//!
//! Both expose the same entry points with the same shapes (opaque handles, `int`-sized enums,
//! a heuristic query that fills result structs, one `Matmul` call that takes its workspace as
//! an argument). What differs is named once per platform in [`Abi`]: the enum values and the
//! layout of the heuristic result. Only the handful of calls a half-precision product with an
//! f32 result needs are bound. Every status goes through [`BlasLtLib::check`].
//!
//! The library is probed before anything is called: a missing library, or one that lacks an
//! entry point, is a reason string for the caller, never a panic.

use super::library_search::{nvidia_library_dirs, rocm_library_candidates};
use crate::error::{Api, ErrorKind, HipError, Result};
use crate::platform_kind::PlatformKind;
use std::ffi::c_void;
use std::path::PathBuf;

type Status = i32;
type Opaque = *mut c_void;

type CreateFn = unsafe extern "C" fn(*mut Opaque) -> Status;
type DestroyFn = unsafe extern "C" fn(Opaque) -> Status;
type DescCreateFn = unsafe extern "C" fn(*mut Opaque, i32, i32) -> Status;
type SetAttributeFn = unsafe extern "C" fn(Opaque, i32, *const c_void, usize) -> Status;
type LayoutCreateFn = unsafe extern "C" fn(*mut Opaque, i32, u64, u64, i64) -> Status;
type HeuristicFn = unsafe extern "C" fn(
    Opaque,
    Opaque,
    Opaque,
    Opaque,
    Opaque,
    Opaque,
    Opaque,
    i32,
    *mut c_void,
    *mut i32,
) -> Status;
type MatmulFn = unsafe extern "C" fn(
    Opaque,
    Opaque,
    *const c_void,
    *const c_void,
    Opaque,
    *const c_void,
    Opaque,
    *const c_void,
    *const c_void,
    Opaque,
    *mut c_void,
    Opaque,
    *const c_void,
    *mut c_void,
    usize,
    Opaque,
) -> Status;

/// Enum values and struct layouts of one platform's library (from `cublasLt.h` /
/// `hipblaslt.h`, `library_types.h`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Abi {
    pub(crate) name: &'static str,
    pub(crate) compute_32f: i32,
    pub(crate) r_32f: i32,
    pub(crate) r_16f: i32,
    pub(crate) desc_transa: i32,
    pub(crate) desc_transb: i32,
    pub(crate) op_n: i32,
    pub(crate) op_t: i32,
    pub(crate) pref_max_workspace_bytes: i32,
    /// Bytes of one heuristic result, and where its `workspaceSize` (size_t) and `state`
    /// (status) fields sit; the algorithm is the struct's leading bytes.
    pub(crate) result_bytes: usize,
    pub(crate) result_workspace_at: usize,
    pub(crate) result_state_at: usize,
}

/// cuBLASLt: `cublasLtMatmulAlgo_t` is 8 `uint64_t`, followed by `size_t workspaceSize`,
/// `cublasStatus_t state`, `float wavesCount`, `int reserved[4]`.
const CUBLASLT: Abi = Abi {
    name: "cuBLASLt",
    compute_32f: 68,
    r_32f: 0,
    r_16f: 2,
    desc_transa: 3,
    desc_transb: 4,
    op_n: 0,
    op_t: 1,
    pref_max_workspace_bytes: 1,
    result_bytes: 96,
    result_workspace_at: 64,
    result_state_at: 72,
};

/// hipBLASLt: `hipblasLtMatmulAlgo_t` is `uint8_t data[16]` and `size_t max_workspace_bytes`,
/// followed by the same four fields as cuBLASLt's.
const HIPBLASLT: Abi = Abi {
    name: "hipBLASLt",
    compute_32f: 2,
    r_32f: 0,
    r_16f: 2,
    desc_transa: 0,
    desc_transb: 1,
    op_n: 111,
    op_t: 112,
    pref_max_workspace_bytes: 1,
    result_bytes: 56,
    result_workspace_at: 24,
    result_state_at: 32,
};

/// The largest heuristic result of either platform, so one buffer type holds both.
pub(crate) const MAX_RESULT_BYTES: usize = 128;

/// The loaded library and its entry points.
pub(crate) struct BlasLtLib {
    _lib: libloading::Library,
    pub(crate) path: String,
    pub(crate) abi: Abi,
    create: CreateFn,
    destroy: DestroyFn,
    desc_create: DescCreateFn,
    desc_set: SetAttributeFn,
    desc_destroy: DestroyFn,
    layout_create: LayoutCreateFn,
    layout_destroy: DestroyFn,
    pref_create: CreateFn,
    pref_set: SetAttributeFn,
    pref_destroy: DestroyFn,
    heuristic: HeuristicFn,
    matmul: MatmulFn,
}

/// File names tried for `platform`'s library, newest soname first, then in the folders where
/// toolkits and wheels put it.
fn candidates(platform: PlatformKind) -> Vec<PathBuf> {
    match platform {
        PlatformKind::Nvidia => {
            let names = ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"];
            let mut out: Vec<PathBuf> = names.iter().map(PathBuf::from).collect();
            for dir in nvidia_library_dirs() {
                out.extend(names.iter().map(|n| dir.join(n)));
            }
            out
        }
        PlatformKind::Amd => {
            let mut out = vec![
                PathBuf::from("libhipblaslt.so.1"),
                PathBuf::from("libhipblaslt.so.0"),
            ];
            out.extend(rocm_library_candidates("libhipblaslt"));
            out
        }
        PlatformKind::None => Vec::new(),
    }
}

impl BlasLtLib {
    /// Opens the platform's library and resolves every entry point. The error says what was
    /// tried and what is missing.
    pub(crate) fn load(platform: PlatformKind) -> std::result::Result<BlasLtLib, String> {
        let (abi, prefix) = match platform {
            PlatformKind::Nvidia => (CUBLASLT, "cublasLt"),
            PlatformKind::Amd => (HIPBLASLT, "hipblasLt"),
            PlatformKind::None => return Err("no GPU platform".into()),
        };
        let tried = candidates(platform);
        let mut last = None;
        for candidate in &tried {
            if candidate.is_absolute() && !candidate.is_file() {
                continue;
            }
            // SAFETY: opening the vendor's library runs its initialisers, which is how it is
            // meant to be used; nothing is called until every symbol below resolved.
            let lib = match unsafe { libloading::Library::new(candidate) } {
                Ok(lib) => lib,
                Err(e) => {
                    last = Some(e.to_string());
                    continue;
                }
            };
            let path = candidate.display().to_string();
            return Self::resolve(lib, path, abi, prefix);
        }
        Err(format!(
            "{} not found ({} candidates tried{})",
            abi.name,
            tried.len(),
            last.map(|e| format!("; last: {e}")).unwrap_or_default()
        ))
    }

    fn resolve(
        lib: libloading::Library,
        path: String,
        abi: Abi,
        prefix: &str,
    ) -> std::result::Result<BlasLtLib, String> {
        macro_rules! sym {
            ($name:literal, $ty:ty) => {{
                let symbol = format!("{prefix}{}\0", $name);
                // SAFETY: the type is the entry point's C signature in both libraries (see the
                // type aliases above, written from cublasLt.h and hipblaslt.h).
                match unsafe { lib.get::<$ty>(symbol.as_bytes()) } {
                    Ok(f) => *f,
                    Err(_) => {
                        return Err(format!(
                            "{path} lacks {}; it is not a usable {}",
                            symbol.trim_end_matches('\0'),
                            abi.name
                        ))
                    }
                }
            }};
        }
        Ok(BlasLtLib {
            create: sym!("Create", CreateFn),
            destroy: sym!("Destroy", DestroyFn),
            desc_create: sym!("MatmulDescCreate", DescCreateFn),
            desc_set: sym!("MatmulDescSetAttribute", SetAttributeFn),
            desc_destroy: sym!("MatmulDescDestroy", DestroyFn),
            layout_create: sym!("MatrixLayoutCreate", LayoutCreateFn),
            layout_destroy: sym!("MatrixLayoutDestroy", DestroyFn),
            pref_create: sym!("MatmulPreferenceCreate", CreateFn),
            pref_set: sym!("MatmulPreferenceSetAttribute", SetAttributeFn),
            pref_destroy: sym!("MatmulPreferenceDestroy", DestroyFn),
            heuristic: sym!("MatmulAlgoGetHeuristic", HeuristicFn),
            matmul: sym!("Matmul", MatmulFn),
            _lib: lib,
            path,
            abi,
        })
    }

    /// The one place a status becomes an error.
    fn check(&self, op: &'static str, status: Status) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        let (kind, name) = self.classify(status);
        Err(HipError {
            op,
            code: status,
            name: format!("{} {name}", self.abi.name),
            api: if self.abi.name == CUBLASLT.name {
                Api::Cuda
            } else {
                Api::Hip
            },
            kind,
            detail: None,
        })
    }

    fn classify(&self, status: Status) -> (ErrorKind, &'static str) {
        if self.abi.name == CUBLASLT.name {
            match status {
                1 => (ErrorKind::Other, "NOT_INITIALIZED"),
                3 => (ErrorKind::OutOfMemory, "ALLOC_FAILED"),
                7 => (ErrorKind::InvalidArgument, "INVALID_VALUE"),
                8 => (ErrorKind::NotSupported, "ARCH_MISMATCH"),
                13 => (ErrorKind::DeviceFault, "EXECUTION_FAILED"),
                15 => (ErrorKind::NotSupported, "NOT_SUPPORTED"),
                _ => (ErrorKind::Other, "status"),
            }
        } else {
            match status {
                1 => (ErrorKind::Other, "NOT_INITIALIZED"),
                2 => (ErrorKind::OutOfMemory, "ALLOC_FAILED"),
                3 => (ErrorKind::InvalidArgument, "INVALID_VALUE"),
                5 => (ErrorKind::DeviceFault, "EXECUTION_FAILED"),
                7 => (ErrorKind::NotSupported, "NOT_SUPPORTED"),
                8 => (ErrorKind::NotSupported, "ARCH_MISMATCH"),
                _ => (ErrorKind::Other, "status"),
            }
        }
    }

    /// A library handle. The caller has made the device current.
    pub(crate) fn create(&self) -> Result<Opaque> {
        let mut handle: Opaque = std::ptr::null_mut();
        // SAFETY: plain out-parameter.
        self.check("MatmulCreate", unsafe { (self.create)(&mut handle) })?;
        Ok(handle)
    }

    /// # Safety
    /// `handle` came from [`Self::create`] and is not used afterwards.
    pub(crate) unsafe fn destroy(&self, handle: Opaque) -> Result<()> {
        // SAFETY: the caller's contract.
        self.check("Destroy", unsafe { (self.destroy)(handle) })
    }

    /// A matmul descriptor: f32 compute and scale, A transposed (`trans_a`), B as is.
    pub(crate) fn matmul_desc(&self, trans_a: bool) -> Result<Opaque> {
        let mut desc: Opaque = std::ptr::null_mut();
        let abi = &self.abi;
        // SAFETY: plain out-parameter; the enum values are this library's (see `Abi`).
        self.check("MatmulDescCreate", unsafe {
            (self.desc_create)(&mut desc, abi.compute_32f, abi.r_32f)
        })?;
        let op_a: i32 = if trans_a { abi.op_t } else { abi.op_n };
        let op_b: i32 = abi.op_n;
        for (attr, value) in [(abi.desc_transa, op_a), (abi.desc_transb, op_b)] {
            // SAFETY: both attributes take an int32 operation; `desc` is live.
            let status = unsafe {
                (self.desc_set)(
                    desc,
                    attr,
                    (&value as *const i32).cast(),
                    std::mem::size_of::<i32>(),
                )
            };
            if let Err(e) = self.check("MatmulDescSetAttribute", status) {
                // SAFETY: created above, not handed out.
                unsafe { (self.desc_destroy)(desc) };
                return Err(e);
            }
        }
        Ok(desc)
    }

    /// # Safety
    /// `desc` came from [`Self::matmul_desc`] and is not used afterwards.
    pub(crate) unsafe fn destroy_desc(&self, desc: Opaque) {
        // SAFETY: the caller's contract. A failure to free a descriptor leaves nothing to do.
        unsafe { (self.desc_destroy)(desc) };
    }

    /// A column-major layout of `rows` x `cols` with leading dimension `ld`, of f16 or f32.
    pub(crate) fn layout(&self, half: bool, rows: u64, cols: u64, ld: i64) -> Result<Opaque> {
        let mut layout: Opaque = std::ptr::null_mut();
        let dtype = if half { self.abi.r_16f } else { self.abi.r_32f };
        // SAFETY: plain out-parameter.
        self.check("MatrixLayoutCreate", unsafe {
            (self.layout_create)(&mut layout, dtype, rows, cols, ld)
        })?;
        Ok(layout)
    }

    /// # Safety
    /// `layout` came from [`Self::layout`] and is not used afterwards.
    pub(crate) unsafe fn destroy_layout(&self, layout: Opaque) {
        // SAFETY: the caller's contract.
        unsafe { (self.layout_destroy)(layout) };
    }

    /// The library's best algorithm for the product, within `max_workspace` bytes: its opaque
    /// bytes (a full heuristic result) and the workspace it needs.
    ///
    /// # Safety
    /// Every handle is live and of this library.
    pub(crate) unsafe fn best_algorithm(
        &self,
        handle: Opaque,
        desc: Opaque,
        [a, b, c, d]: [Opaque; 4],
        max_workspace: usize,
    ) -> Result<([u8; MAX_RESULT_BYTES], usize)> {
        let mut pref: Opaque = std::ptr::null_mut();
        // SAFETY: plain out-parameter.
        self.check("MatmulPreferenceCreate", unsafe {
            (self.pref_create)(&mut pref)
        })?;
        let limit = max_workspace as u64;
        // SAFETY: the attribute takes a uint64; `pref` is live.
        let set = unsafe {
            (self.pref_set)(
                pref,
                self.abi.pref_max_workspace_bytes,
                (&limit as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        // Aligned like the structs it holds (size_t and 64-bit words).
        #[repr(C, align(16))]
        struct ResultBytes([u8; MAX_RESULT_BYTES]);
        let mut result = ResultBytes([0; MAX_RESULT_BYTES]);
        let mut found = 0i32;
        let queried = self
            .check("MatmulPreferenceSetAttribute", set)
            .and_then(|()| {
                // SAFETY: the caller vouches for the handles; one result is asked for and the
                // buffer holds one of this library's results (`result_bytes <= MAX_RESULT_BYTES`).
                let status = unsafe {
                    (self.heuristic)(
                        handle,
                        desc,
                        a,
                        b,
                        c,
                        d,
                        pref,
                        1,
                        result.0.as_mut_ptr().cast(),
                        &mut found,
                    )
                };
                self.check("MatmulAlgoGetHeuristic", status)
            });
        // SAFETY: created above, used only here.
        unsafe { (self.pref_destroy)(pref) };
        queried?;
        let result = &result.0[..self.abi.result_bytes];
        let field = |at: usize, n: usize| &result[at..at + n];
        let state = i32::from_ne_bytes(
            field(self.abi.result_state_at, 4)
                .try_into()
                .unwrap_or([0; 4]),
        );
        if found < 1 || state != 0 {
            return Err(HipError::host(
                "MatmulAlgoGetHeuristic",
                ErrorKind::NotSupported,
                format!(
                    "{} has no algorithm for this product within {max_workspace} bytes of \
                     workspace",
                    self.abi.name
                ),
            ));
        }
        let workspace = u64::from_ne_bytes(
            field(self.abi.result_workspace_at, 8)
                .try_into()
                .unwrap_or([0; 8]),
        ) as usize;
        let mut algo = [0; MAX_RESULT_BYTES];
        algo[..result.len()].copy_from_slice(result);
        Ok((algo, workspace))
    }

    /// Queues `D = A·B` (alpha 1, beta 0, C = D) on `stream`.
    ///
    /// # Safety
    /// Every handle is live and of this library; `algo` came from [`Self::best_algorithm`] for
    /// the same descriptor and layouts; the pointers are device memory of the layouts' sizes
    /// and the workspace holds `workspace_bytes`, all staying allocated until the stream has
    /// run the product; the device is current.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn matmul(
        &self,
        handle: Opaque,
        desc: Opaque,
        algo: &[u8; MAX_RESULT_BYTES],
        [a_layout, b_layout, d_layout]: [Opaque; 3],
        [a, b, d]: [u64; 3],
        workspace: u64,
        workspace_bytes: usize,
        stream: Opaque,
    ) -> Result<()> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the caller's contract; alpha and beta are host f32 (the default pointer mode,
        // matching the f32 scale type).
        let status = unsafe {
            (self.matmul)(
                handle,
                desc,
                (&alpha as *const f32).cast(),
                a as *const c_void,
                a_layout,
                b as *const c_void,
                b_layout,
                (&beta as *const f32).cast(),
                d as *const c_void,
                d_layout,
                d as *mut c_void,
                d_layout,
                algo.as_ptr().cast(),
                workspace as *mut c_void,
                workspace_bytes,
                stream,
            )
        };
        self.check("Matmul", status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_result_layouts_fit_the_shared_buffer() {
        for abi in [CUBLASLT, HIPBLASLT] {
            assert!(abi.result_bytes <= MAX_RESULT_BYTES, "{}", abi.name);
            assert!(
                abi.result_workspace_at + 8 <= abi.result_state_at,
                "{}",
                abi.name
            );
            assert!(abi.result_state_at + 4 <= abi.result_bytes, "{}", abi.name);
        }
    }

    #[test]
    fn a_missing_library_is_a_reason_not_a_panic() {
        let err = BlasLtLib::load(PlatformKind::None)
            .err()
            .expect("no platform, no library");
        assert!(err.contains("no GPU platform"), "{err}");
    }

    #[test]
    fn statuses_name_their_library() {
        for (platform, name) in [
            (PlatformKind::Nvidia, "cuBLASLt"),
            (PlatformKind::Amd, "hipBLASLt"),
        ] {
            // Whether or not the library is here, the message names it.
            if let Err(reason) = BlasLtLib::load(platform) {
                assert!(reason.contains(name), "{reason}");
            }
        }
    }
}
