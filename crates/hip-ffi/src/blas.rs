//! Half-precision matrix products through the vendor's GEMM library (cuBLASLt on NVIDIA,
//! hipBLASLt on AMD), loaded at run time and probed before use.
//!
//! The library never allocates device memory on its own here: each product's workspace is an
//! argument, so the caller takes it from its allocator and it is counted like every other byte.
//! A missing library is a reason the caller can print ([`BlasLt::open`]), so a caller keeps a
//! path that needs no vendor library.
//!
//! Shapes are row-major, as the rest of hipdecode stores them: `d[n][m] = Σ_k a[m][k] · b[n][k]`
//! with `a` the f16 weights (`m` rows of `k`), `b` the f16 activations (`n` rows of `k`) and `d`
//! f32. In the libraries' column-major terms that is `D = Aᵀ·B`, the layout they run fastest.
//! A result row may be longer than `m` ([`GemmShape::d_stride`]), so a product over a block of
//! the weights' rows writes its columns of a wider result.

use crate::device::{Device, DevicePtr};
use crate::error::{ErrorKind, HipError, Result};
use crate::ffi::blaslt::{BlasLtLib, MAX_RESULT_BYTES};
use crate::ffi::RawHandle;
use crate::platform_kind::PlatformKind;
use crate::stream::Stream;
use std::sync::OnceLock;

/// The library of each platform, loaded once per process (or the reason it could not be).
fn library(platform: PlatformKind) -> std::result::Result<&'static BlasLtLib, String> {
    static NVIDIA: OnceLock<std::result::Result<BlasLtLib, String>> = OnceLock::new();
    static AMD: OnceLock<std::result::Result<BlasLtLib, String>> = OnceLock::new();
    let cell = match platform {
        PlatformKind::Nvidia => &NVIDIA,
        PlatformKind::Amd => &AMD,
        PlatformKind::None => return Err("no GPU platform".into()),
    };
    cell.get_or_init(|| BlasLtLib::load(platform))
        .as_ref()
        .map_err(Clone::clone)
}

/// An open handle of the vendor GEMM library on one device.
pub struct BlasLt {
    lib: &'static BlasLtLib,
    handle: RawHandle,
    device: Device,
}

/// The dimensions of one product (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmShape {
    /// Rows of the weights, columns of the result.
    pub m: usize,
    /// Rows of the activations and of the result.
    pub n: usize,
    /// The shared inner dimension.
    pub k: usize,
    /// Values from one result row to the next (`m` when the result is exactly `n` x `m`).
    pub d_stride: usize,
}

impl GemmShape {
    /// A product whose result rows are exactly `m` long.
    pub fn dense(m: usize, n: usize, k: usize) -> GemmShape {
        GemmShape {
            m,
            n,
            k,
            d_stride: m,
        }
    }
}

impl BlasLt {
    /// Opens the library for `device`'s platform. `Err` carries why it is unusable (not
    /// installed, an entry point missing, the handle refused) for the caller to report.
    pub fn open(device: &Device) -> std::result::Result<BlasLt, String> {
        let lib = library(device.platform())?;
        device
            .api
            .make_current(device.ordinal)
            .map_err(|e| format!("{}: {e}", lib.path))?;
        let handle = lib
            .create()
            .map_err(|e| format!("{}: creating a handle: {e}", lib.path))?;
        Ok(BlasLt {
            lib,
            handle: RawHandle::from_ptr(handle),
            device: *device,
        })
    }

    /// The library's name and the file it was loaded from.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.lib.abi.name, self.lib.path)
    }

    /// Prepares the product of `shape`: descriptors and the library's best algorithm that fits
    /// in `max_workspace` bytes of workspace.
    pub fn plan(&self, shape: GemmShape, max_workspace: usize) -> Result<GemmPlan> {
        let GemmShape { m, n, k, d_stride } = shape;
        if m == 0 || n == 0 || k == 0 {
            return Err(HipError::host(
                "blasLt plan",
                ErrorKind::InvalidArgument,
                format!("an empty product ({m} x {n} x {k})"),
            ));
        }
        if d_stride < m {
            return Err(HipError::host(
                "blasLt plan",
                ErrorKind::InvalidArgument,
                format!("result rows {d_stride} apart cannot hold {m} values"),
            ));
        }
        self.device.api.make_current(self.device.ordinal)?;
        let lib = self.lib;
        let mut plan = GemmPlan {
            lib,
            shape,
            desc: RawHandle::NULL,
            layouts: [RawHandle::NULL; 3],
            algo: [0; MAX_RESULT_BYTES],
            workspace_bytes: 0,
        };
        // Filled in one at a time, so a failure part way drops (and frees) what was made.
        plan.desc = RawHandle::from_ptr(lib.matmul_desc(true)?);
        let (m, n, k) = (m as u64, n as u64, k as u64);
        plan.layouts[0] = RawHandle::from_ptr(lib.layout(true, k, m, k as i64)?);
        plan.layouts[1] = RawHandle::from_ptr(lib.layout(true, k, n, k as i64)?);
        plan.layouts[2] = RawHandle::from_ptr(lib.layout(false, m, n, d_stride as i64)?);
        let [a, b, d] = plan.layouts.map(|l| l.as_ptr());
        // SAFETY: the handle and the descriptors are live and of this library.
        let (algo, workspace) = unsafe {
            lib.best_algorithm(
                self.handle.as_ptr(),
                plan.desc.as_ptr(),
                [a, b, d, d],
                max_workspace,
            )
        }?;
        plan.algo = algo;
        plan.workspace_bytes = workspace;
        Ok(plan)
    }

    /// Queues the product `plan` describes on `stream`.
    ///
    /// # Safety
    /// `a`, `b` and `d` are device memory of this device holding `m·k` f16, `n·k` f16 (row-major,
    /// densely packed) and `n` result rows of `m` f32 `d_stride` apart, `workspace` holds `plan.workspace_bytes()` bytes
    /// (or is null when that is 0), and all stay allocated until `stream` has run the product.
    pub unsafe fn gemm(
        &self,
        plan: &GemmPlan,
        a: DevicePtr,
        b: DevicePtr,
        d: DevicePtr,
        workspace: DevicePtr,
        stream: &Stream,
    ) -> Result<()> {
        if !std::ptr::eq(plan.lib, self.lib) || stream.device().ordinal != self.device.ordinal {
            return Err(HipError::host(
                "blasLt gemm",
                ErrorKind::InvalidArgument,
                "the plan or the stream belongs to another library handle or device",
            ));
        }
        self.device.api.make_current(self.device.ordinal)?;
        // SAFETY: the handles are live (owned by `self` and `plan`), the algorithm came from
        // `plan`'s own query, and the caller vouches for the memory and the stream.
        unsafe {
            self.lib.matmul(
                self.handle.as_ptr(),
                plan.desc.as_ptr(),
                &plan.algo,
                plan.layouts.map(|l| l.as_ptr()),
                [a.0, b.0, d.0],
                workspace.0,
                plan.workspace_bytes,
                stream.raw().as_ptr(),
            )
        }
    }
}

impl Drop for BlasLt {
    fn drop(&mut self) {
        if self.device.api.make_current(self.device.ordinal).is_ok() {
            // SAFETY: the handle came from `create` and is not used after this.
            if let Err(e) = unsafe { self.lib.destroy(self.handle.as_ptr()) } {
                tracing::warn!("destroying the {} handle: {e}", self.lib.abi.name);
            }
        }
    }
}

/// A prepared product: descriptors, layouts and the chosen algorithm.
pub struct GemmPlan {
    lib: &'static BlasLtLib,
    shape: GemmShape,
    desc: RawHandle,
    layouts: [RawHandle; 3],
    algo: [u8; MAX_RESULT_BYTES],
    workspace_bytes: usize,
}

impl GemmPlan {
    /// The product's dimensions.
    pub fn shape(&self) -> GemmShape {
        self.shape
    }

    /// Bytes of workspace the chosen algorithm needs (0 for none).
    pub fn workspace_bytes(&self) -> usize {
        self.workspace_bytes
    }
}

impl Drop for GemmPlan {
    fn drop(&mut self) {
        for layout in self.layouts {
            if layout != RawHandle::NULL {
                // SAFETY: made by `BlasLt::plan` for this plan only.
                unsafe { self.lib.destroy_layout(layout.as_ptr()) };
            }
        }
        if self.desc != RawHandle::NULL {
            // SAFETY: as above.
            unsafe { self.lib.destroy_desc(self.desc.as_ptr()) };
        }
    }
}
