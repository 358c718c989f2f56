//! Device arrays: the backend's f32 buffers (KV caches also f16 or q8_0) and their 8-bit
//! shadows.

use crate::kv::KvType;
use crate::layout::workspace;
use rocm_alloc::{Allocation, GrowableRegion};
use rocm_kernels::ops::{
    kv_cache,
    matvec_q8::{self, Q8ActivationsMut},
};
use rocm_kernels::{DeviceSlice, DeviceSliceMut};
use std::cell::RefCell;

/// Where a buffer's memory comes from.
pub(super) enum BufferMemory {
    /// A block of the allocator's pools, whole from the start.
    Pooled(Allocation),
    /// A growable region (a paged KV pool): only its committed prefix is backed, and the
    /// buffer's users touch only values below it (the pool hands out committed blocks only).
    Region(GrowableRegion),
    /// The bytes from `offset` of a block shared with the buffers made with it
    /// (`Backend::alloc_together`); the block is freed with the last of them.
    Piece {
        block: std::sync::Arc<Allocation>,
        offset: u64,
    },
}

impl BufferMemory {
    pub(super) fn ptr(&self) -> u64 {
        match self {
            BufferMemory::Pooled(a) => a.ptr(),
            BufferMemory::Region(r) => r.ptr(),
            BufferMemory::Piece { block, offset } => block.ptr() + offset,
        }
    }
}

/// A device array drawn from the allocator: f32, or for a KV cache the type it stores (see
/// [`crate::kv::KvType`]).
pub struct GpuBuffer {
    pub(super) mem: BufferMemory,
    pub(super) len: usize,
    pub(super) elem: Elem,
    /// This buffer among all the backend's buffers.
    pub(super) id: u64,
    /// Bumped by every mutable view, so a copy derived from the contents knows when it is
    /// stale.
    pub(super) version: u64,
    /// The 8-bit copy the integer matrix-vector kernels read (see [`Q8Shadow`]).
    pub(super) q8: RefCell<Option<Q8Shadow>>,
}

impl GpuBuffer {
    pub(super) fn new(mem: Allocation, len: usize) -> GpuBuffer {
        GpuBuffer::with_elem(BufferMemory::Pooled(mem), len, Elem::F32)
    }

    pub(super) fn with_elem(mem: BufferMemory, len: usize, elem: Elem) -> GpuBuffer {
        // Unique for the process's life, unlike the address, which a later buffer may reuse.
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        GpuBuffer {
            mem,
            len,
            elem,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            version: 0,
            q8: RefCell::new(None),
        }
    }

    /// Values it holds.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Which buffer it is (with [`Self::version`], what a copy derived from it was made from).
    pub(super) fn id(&self) -> u64 {
        self.id
    }

    pub(super) fn version(&self) -> u64 {
        self.version
    }

    pub(super) fn view(&self) -> DeviceSlice<f32> {
        // Only KV caches are f16 or q8_0, and only the KV ops take them (through `kv_view`).
        assert_eq!(
            self.elem,
            Elem::F32,
            "a {:?} KV buffer used as f32",
            self.elem
        );
        // SAFETY: the allocation holds `len` f32 and lives as long as `self`; kernels using the
        // view are queued on the backend's one stream, and the allocation returns to the
        // allocator on that same stream, so its memory is not reused before they run.
        unsafe { DeviceSlice::from_raw(self.mem.ptr(), self.len) }
    }

    pub(super) fn view_mut(&mut self) -> DeviceSliceMut<f32> {
        assert_eq!(
            self.elem,
            Elem::F32,
            "a {:?} KV buffer used as f32",
            self.elem
        );
        self.version += 1;
        // SAFETY: as in `view`; `&mut self` guarantees no other host-side view of this buffer
        // is handed to the same launch.
        unsafe { DeviceSliceMut::from_raw(self.mem.ptr(), self.len) }
    }
}

impl GpuBuffer {
    /// Records that the 8-bit copy now holds the buffer's first `values` values as they are.
    pub(super) fn mark_q8_fresh(&self, values: usize) {
        if let Some(s) = self.q8.borrow_mut().as_mut() {
            s.made_from = Some((self.version, values));
        }
    }

    pub(super) fn kv_view(&self) -> kv_cache::KvSlice {
        // SAFETY: the allocation holds `len` elements of `elem` (see `view`).
        unsafe {
            match self.elem {
                Elem::F32 => {
                    kv_cache::KvSlice::F32(DeviceSlice::from_raw(self.mem.ptr(), self.len))
                }
                Elem::F16 => {
                    kv_cache::KvSlice::F16(DeviceSlice::from_raw(self.mem.ptr(), self.len))
                }
                Elem::Q8_0 => kv_cache::KvSlice::Q8_0(DeviceSlice::from_raw(
                    self.mem.ptr(),
                    self.elem.bytes(self.len),
                )),
            }
        }
    }

    pub(super) fn kv_view_mut(&mut self) -> kv_cache::KvSliceMut {
        self.version += 1;
        // SAFETY: as in `kv_view`, with `&mut self` as in `view_mut`.
        unsafe {
            match self.elem {
                Elem::F32 => {
                    kv_cache::KvSliceMut::F32(DeviceSliceMut::from_raw(self.mem.ptr(), self.len))
                }
                Elem::F16 => {
                    kv_cache::KvSliceMut::F16(DeviceSliceMut::from_raw(self.mem.ptr(), self.len))
                }
                Elem::Q8_0 => kv_cache::KvSliceMut::Q8_0(DeviceSliceMut::from_raw(
                    self.mem.ptr(),
                    self.elem.bytes(self.len),
                )),
            }
        }
    }
}

/// Element type of a [`GpuBuffer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Elem {
    F32,
    F16,
    /// ggml's q8_0 blocks (`rocm_kernels::reference::kv_q8`); `len` counts values, a whole
    /// number of blocks.
    Q8_0,
}

impl Elem {
    /// The element type of a KV cache of `kv`.
    pub(super) fn of(kv: KvType) -> Elem {
        match kv {
            KvType::F32 => Elem::F32,
            KvType::F16 => Elem::F16,
            KvType::Q8_0 => Elem::Q8_0,
        }
    }

    pub(super) fn kv_type(self) -> KvType {
        match self {
            Elem::F32 => KvType::F32,
            Elem::F16 => KvType::F16,
            Elem::Q8_0 => KvType::Q8_0,
        }
    }

    /// Bytes of `values` values, which the buffer's allocation holds (checked when made).
    pub(super) fn bytes(self, values: usize) -> usize {
        self.kv_type()
            .bytes(values)
            .expect("a buffer's values fit its type: checked when it was made")
    }
}

/// A buffer's leading rows quantized to 8 bits (`matvec_q8::quantize`), made when a matrix-vector
/// product first reads the buffer after it changed and shared by every product that reads the
/// same contents (Q, K and V; gate and up). Host-side bookkeeping decides whether it is fresh;
/// a step's ops run in the same order at every position, so a captured step re-quantizes
/// exactly where the eager step did.
pub(super) struct Q8Shadow {
    pub(super) mem: Allocation,
    /// Values it has room for (the scales follow them, 16-byte aligned).
    pub(super) capacity: usize,
    /// The buffer version and the count of leading values it was made from.
    pub(super) made_from: Option<(u64, usize)>,
}

impl Q8Shadow {
    pub(super) fn scales_offset(capacity: usize) -> usize {
        workspace::q8_scales_offset(capacity)
    }

    pub(super) fn bytes_for(capacity: usize) -> usize {
        workspace::q8_shadow_bytes(capacity)
    }

    /// Views of the first `values` values and their scales.
    pub(super) fn views(&self, values: usize) -> Q8ActivationsMut {
        debug_assert!(values <= self.capacity);
        // SAFETY: the allocation is `bytes_for(capacity)` bytes and lives as long as the buffer
        // that owns the shadow.
        unsafe { q8_views(self.mem.ptr(), self.capacity, values) }
    }
}

/// Views of the first `values` values and their scales in memory laid out for `capacity`
/// values: the values, then from the 16-byte aligned `Q8Shadow::scales_offset(capacity)`
/// their f32 scales, one per 32 values.
///
/// # Safety
/// `base` must point to at least `Q8Shadow::bytes_for(capacity)` bytes that outlive the views,
/// and `values <= capacity`.
pub(super) unsafe fn q8_views(base: u64, capacity: usize, values: usize) -> Q8ActivationsMut {
    // SAFETY: both views lie inside the `bytes_for(capacity)` bytes the caller vouches for.
    unsafe {
        Q8ActivationsMut {
            values: DeviceSliceMut::from_raw(base, values),
            scales: DeviceSliceMut::from_raw(
                base + Q8Shadow::scales_offset(capacity) as u64,
                values / matvec_q8::GROUP,
            ),
        }
    }
}
