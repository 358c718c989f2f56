//! [`DeviceCopy`], the element types that may be copied between host and device memory. A
//! module of its own because the copies of [`crate::memory`] and the stream-ordered copies of
//! [`crate::stream`] both take only such elements, and the memory module uses streams: kept in
//! either, it would tie the two into a ring.

mod sealed {
    pub trait Sealed {}
}

/// Plain numeric types that may be copied byte-for-byte between host and device: every bit
/// pattern is a valid value and there is no padding. Sealed; implemented for the primitive
/// integers and floats.
pub trait DeviceCopy: Copy + Default + sealed::Sealed + 'static {}

macro_rules! device_copy {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl DeviceCopy for $t {}
    )*};
}
device_copy!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);
