//! Block layouts of the quantized types, `#[repr(C)]` and field-for-field identical to ggml's
//! `block_*` structs, so that code computing on quantized data (fused dot products) can view a
//! tensor's bytes as a slice of blocks with [`as_blocks`].

use half::f16;

/// 32 weights, 4 bits each, one scale: `w = d * (q - 8)`.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: f16,
    /// Low nibbles are elements 0..16, high nibbles 16..32.
    pub qs: [u8; 16],
}

/// 32 weights, 4 bits each, scale and minimum: `w = d * q + m`.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; 16],
}

/// 32 weights, 5 bits each: `w = d * (q - 16)`; bit 4 of element `j` is bit `j` of `qh`.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

/// 32 weights, 5 bits each, scale and minimum: `w = d * q + m`.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

/// 32 weights, 8 bits each: `w = d * q`.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; 32],
}

/// 256 weights in 16 groups of 16, 2 bits each; 4-bit group scales and minimums.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockQ2K {
    pub scales: [u8; 16],
    pub qs: [u8; 64],
    pub d: f16,
    pub dmin: f16,
}

/// 256 weights in 16 groups of 16, 3 bits each (2 in `qs`, 1 in `hmask`); 6-bit signed scales.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockQ3K {
    pub hmask: [u8; 32],
    pub qs: [u8; 64],
    pub scales: [u8; 12],
    pub d: f16,
}

/// 256 weights in 8 groups of 32, 4 bits each; 6-bit group scales and minimums packed in 12 bytes.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}

/// 256 weights in 8 groups of 32, 5 bits each (bit 4 in `qh`); scales as [`BlockQ4K`].
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}

/// 256 weights in 16 groups of 16, 6 bits each (4 in `ql`, 2 in `qh`); 8-bit signed scales.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: f16,
}

/// 256 8-bit values with an f32 scale and per-16 sums: the activation format K-quant dot
/// products pair with.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; 256],
    pub bsums: [i16; 16],
}

/// 32 weights, 4-bit indices into a fixed non-linear table, one scale.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockIq4Nl {
    pub d: f16,
    pub qs: [u8; 16],
}

/// 256 weights, 4-bit non-linear indices, 6-bit group scales.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockIq4Xs {
    pub d: f16,
    pub scales_h: u16,
    pub scales_l: [u8; 4],
    pub qs: [u8; 128],
}

/// 32 weights in FP4 (E2M1) with a shared E8M0 exponent.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct BlockMxfp4 {
    pub e: u8,
    pub qs: [u8; 16],
}

// The layouts must match ggml byte for byte.
const _: () = {
    assert!(size_of::<BlockQ4_0>() == 18);
    assert!(size_of::<BlockQ4_1>() == 20);
    assert!(size_of::<BlockQ5_0>() == 22);
    assert!(size_of::<BlockQ5_1>() == 24);
    assert!(size_of::<BlockQ8_0>() == 34);
    assert!(size_of::<BlockQ2K>() == 84);
    assert!(size_of::<BlockQ3K>() == 110);
    assert!(size_of::<BlockQ4K>() == 144);
    assert!(size_of::<BlockQ5K>() == 176);
    assert!(size_of::<BlockQ6K>() == 210);
    assert!(size_of::<BlockQ8K>() == 292);
    assert!(size_of::<BlockIq4Nl>() == 18);
    assert!(size_of::<BlockIq4Xs>() == 136);
    assert!(size_of::<BlockMxfp4>() == 17);
};

mod sealed {
    pub trait Sealed {}
}

/// A block type that may be viewed in place over file bytes.
///
/// # Safety
/// Implementors are `#[repr(C)]`, have no padding, and every bit pattern is a valid value
/// (they consist only of integers, `f16` and `f32`, and arrays of those).
pub unsafe trait QuantBlock: sealed::Sealed + Copy + 'static {}

macro_rules! quant_blocks {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        // SAFETY: the struct is #[repr(C)] of integer/float fields; the size asserts above
        // show there is no padding, and integers and floats accept every bit pattern.
        unsafe impl QuantBlock for $t {}
    )*};
}
quant_blocks!(
    BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K,
    BlockQ6K, BlockQ8K, BlockIq4Nl, BlockIq4Xs, BlockMxfp4
);

/// Views `bytes` as a slice of blocks without copying. `None` if the length is not a whole
/// number of blocks or the start is not aligned for `B` (tensor data in a GGUF file is aligned
/// to at least 32 bytes, so this only fails for slices that were cut unusually).
pub fn as_blocks<B: QuantBlock>(bytes: &[u8]) -> Option<&[B]> {
    let size = size_of::<B>();
    if !bytes.len().is_multiple_of(size)
        || !(bytes.as_ptr() as usize).is_multiple_of(align_of::<B>())
    {
        return None;
    }
    // SAFETY: the pointer is aligned for B (checked above), the length is a whole number of
    // B (checked above), B is plain data valid for every bit pattern (QuantBlock contract), and
    // the returned slice borrows `bytes`, so it cannot outlive or alias mutably the source.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) })
}
