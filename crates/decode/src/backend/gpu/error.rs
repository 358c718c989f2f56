//! How the GPU backend names a failed step in its errors.

use crate::error::DecodeError;

pub(super) fn gpu_err(what: &str, e: impl std::fmt::Display) -> DecodeError {
    DecodeError::Gpu(format!("{what}: {e}"))
}

/// Maps a kernel's or a runtime's error to the decode error that names the failed step.
pub(super) fn kerr<E: std::fmt::Display>(op: &str) -> impl Fn(E) -> DecodeError + '_ {
    move |e| gpu_err(op, e)
}
