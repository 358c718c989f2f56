//! Implementations of [`crate::RawDevice`].

// pub mod hip; (added with the hip-ffi backend)
pub mod sim;
