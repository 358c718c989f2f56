//! Errors of kernel compilation, caching and launches.

/// What went wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The runtime or compiler failed (the message carries the compile log where there is one).
    #[error(transparent)]
    Hip(#[from] hip_ffi::HipError),
    /// A launch wrapper was given views too short for the shape, or a shape it cannot run.
    #[error("{op}: {message}")]
    Shape {
        /// The op that refused.
        op: &'static str,
        /// What does not fit, with the numbers.
        message: String,
    },
    /// A weight format this op has no kernel for.
    #[error("{op}: no kernel for weight format {}; supported: {supported}", .format.name())]
    UnsupportedFormat {
        /// The op that refused.
        op: &'static str,
        /// The format asked for.
        format: gguf_loader::GgmlType,
        /// The formats that work, for the message.
        supported: String,
    },
    /// A variable of this crate ([`crate::knobs`]) holds a value it does not accept.
    #[error(transparent)]
    Knob(#[from] knobs::KnobError),
    /// An environment variable of this crate holds a value that cannot be used.
    #[error("{variable}={value:?} {message}")]
    Env {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What is wrong and what to set instead.
        message: String,
    },
    /// A kernel module has no entry point of that name (a mismatch between `source.rs` and the
    /// module's source file).
    #[error("kernel module `{module}` has no entry point `{name}`")]
    MissingEntryPoint {
        /// The module's name.
        module: &'static str,
        /// The entry point asked for.
        name: &'static str,
    },
    /// The kernel disk cache could not be used (the path and the reason).
    #[error("kernel cache at {path}: {message}")]
    Cache {
        /// The cache folder or file.
        path: String,
        /// What failed and what to do about it.
        message: String,
    },
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, KernelError>;

/// Returns a [`KernelError::Shape`] error unless `ok`.
pub(crate) fn check_shape(
    ok: bool,
    op: &'static str,
    message: impl FnOnce() -> String,
) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(KernelError::Shape {
            op,
            message: message(),
        })
    }
}
