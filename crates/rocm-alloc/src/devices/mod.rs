//! Implementations of [`crate::RawDevice`].

pub mod hip;
pub mod sim;
