//! Typed views of device memory.
//!
//! A view is an address, a length and an element type; it owns nothing. Making one is the
//! unsafe step (the caller vouches that the memory exists, is of that type, and outlives the
//! queued work), so the launch wrappers in [`crate::ops`] can be safe: they check every shape
//! against the views' lengths before launching.

use hip_ffi::DevicePtr;
use std::marker::PhantomData;

/// Read-only view of `len` elements of `T` in device memory.
#[derive(Debug)]
pub struct DeviceSlice<T> {
    addr: u64,
    len: usize,
    _elem: PhantomData<*const T>,
}

/// Writable view of `len` elements of `T` in device memory.
#[derive(Debug)]
pub struct DeviceSliceMut<T> {
    addr: u64,
    len: usize,
    _elem: PhantomData<*mut T>,
}

impl<T> Clone for DeviceSlice<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DeviceSlice<T> {}

// SAFETY: a view is an address and a length; the device memory it names is not touched by the
// host through it, so sending it to another thread is as safe as sending the integer.
unsafe impl<T> Send for DeviceSlice<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for DeviceSlice<T> {}
// SAFETY: as above.
unsafe impl<T> Send for DeviceSliceMut<T> {}

impl<T> DeviceSlice<T> {
    /// A view of `len` elements at `addr`.
    ///
    /// # Safety
    /// `addr` must be aligned for `T` and the start of at least `len * size_of::<T>()` bytes of
    /// device memory holding values of `T`, which stays allocated until every kernel queued with
    /// this view has run.
    pub unsafe fn from_raw(addr: u64, len: usize) -> Self {
        DeviceSlice {
            addr,
            len,
            _elem: PhantomData,
        }
    }

    /// Device address of the first element.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address as the launch builder takes it.
    pub fn ptr(&self) -> DevicePtr {
        DevicePtr(self.addr)
    }

    /// Elements `start..start + len` of this view, or `None` when out of range.
    pub fn slice(&self, start: usize, len: usize) -> Option<DeviceSlice<T>> {
        let end = start.checked_add(len)?;
        (end <= self.len).then(|| DeviceSlice {
            addr: self.addr + (start * std::mem::size_of::<T>()) as u64,
            len,
            _elem: PhantomData,
        })
    }
}

impl<T> DeviceSliceMut<T> {
    /// A writable view of `len` elements at `addr`.
    ///
    /// # Safety
    /// As [`DeviceSlice::from_raw`], and no other view may be written through or read from the
    /// same memory by work that can run at the same time.
    pub unsafe fn from_raw(addr: u64, len: usize) -> Self {
        DeviceSliceMut {
            addr,
            len,
            _elem: PhantomData,
        }
    }

    /// Device address of the first element.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address as the launch builder takes it.
    pub fn ptr(&self) -> DevicePtr {
        DevicePtr(self.addr)
    }

    /// The same memory, read-only (for an op that reads and writes one buffer).
    pub fn as_const(&self) -> DeviceSlice<T> {
        DeviceSlice {
            addr: self.addr,
            len: self.len,
            _elem: PhantomData,
        }
    }

    /// Elements `start..start + len`, reborrowed, or `None` when out of range.
    pub fn slice_mut(&mut self, start: usize, len: usize) -> Option<DeviceSliceMut<T>> {
        let end = start.checked_add(len)?;
        (end <= self.len).then(|| DeviceSliceMut {
            addr: self.addr + (start * std::mem::size_of::<T>()) as u64,
            len,
            _elem: PhantomData,
        })
    }
}
