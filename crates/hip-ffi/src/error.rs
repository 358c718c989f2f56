//! The one error type of this crate: which operation failed, with which status code.

use std::fmt;

/// Which runtime produced a status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Api {
    /// AMD HIP runtime (`hipError_t`) or hiprtc (`hiprtcResult`).
    Hip,
    /// CUDA driver API (`CUresult`) or NVRTC (`nvrtcResult`).
    Cuda,
    /// No runtime call was made: the failure was found on the Rust side.
    Host,
}

/// A portable classification of a failure, so callers (the allocator, the decoder) can react
/// to out-of-memory or not-supported without knowing whether HIP or CUDA said it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The device (or pinned host memory) is out of memory.
    OutOfMemory,
    /// The device or runtime does not support this operation.
    NotSupported,
    /// No usable GPU or runtime library was found.
    NoDevice,
    /// An argument was rejected (bad size, pointer, handle or launch configuration).
    InvalidArgument,
    /// Run-time kernel compilation failed; the message holds the compiler log.
    Compile,
    /// A stream capture went wrong (unsupported call while capturing, invalidated capture).
    Capture,
    /// A kernel faulted or the device is in an unusable state.
    DeviceFault,
    /// Anything else.
    Other,
}

/// A failed runtime call: the operation, the raw status code, its symbolic name, and the backend.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct HipError {
    /// The operation that failed, e.g. `hipMalloc` or `cuMemAlloc` (or a Rust-side step).
    pub op: &'static str,
    /// The raw status code the runtime returned (0 for host-side failures).
    pub code: i32,
    /// The runtime's name for the code, e.g. `hipErrorOutOfMemory`.
    pub name: String,
    /// Which runtime the code belongs to.
    pub api: Api,
    /// Portable classification of `code`.
    pub kind: ErrorKind,
    /// Extra context: a compiler log, the argument that was wrong, what to do about it.
    pub detail: Option<String>,
}

/// Result alias used throughout the crate.
pub type Result<T, E = HipError> = std::result::Result<T, E>;

impl HipError {
    /// An error that did not come from a runtime status code.
    pub fn host(op: &'static str, kind: ErrorKind, detail: impl Into<String>) -> Self {
        HipError {
            op,
            code: 0,
            name: host_kind_name(kind).to_string(),
            api: Api::Host,
            kind,
            detail: Some(detail.into()),
        }
    }

    /// Attaches extra context (kept, not replaced, if some is already there).
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        let detail = detail.into();
        self.detail = Some(match self.detail.take() {
            Some(existing) => format!("{existing}; {detail}"),
            None => detail,
        });
        self
    }

    /// True when the failure is an out-of-memory condition.
    pub fn is_out_of_memory(&self) -> bool {
        self.kind == ErrorKind::OutOfMemory
    }

    /// True when the runtime reported the operation as unsupported here.
    pub fn is_not_supported(&self) -> bool {
        self.kind == ErrorKind::NotSupported
    }
}

fn host_kind_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::OutOfMemory => "OutOfMemory",
        ErrorKind::NotSupported => "NotSupported",
        ErrorKind::NoDevice => "NoDevice",
        ErrorKind::InvalidArgument => "InvalidArgument",
        ErrorKind::Compile => "CompileError",
        ErrorKind::Capture => "CaptureError",
        ErrorKind::DeviceFault => "DeviceFault",
        ErrorKind::Other => "Error",
    }
}

impl fmt::Display for HipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.api {
            Api::Host => write!(f, "{} failed: {}", self.op, self.name)?,
            Api::Hip | Api::Cuda => {
                write!(f, "{} failed with {} ({})", self.op, self.name, self.code)?
            }
        }
        if let Some(detail) = &self.detail {
            write!(f, ": {detail}")?;
        }
        Ok(())
    }
}

/// Classifies a `hipError_t` value. The numbers are HIP's, which follow CUDA's runtime codes.
pub(crate) fn classify_hip(code: i32) -> ErrorKind {
    match code {
        2 => ErrorKind::OutOfMemory,
        801 => ErrorKind::NotSupported,
        100 | 35 => ErrorKind::NoDevice,
        1 | 9 | 17 | 21 | 98 | 101 | 400 | 701 => ErrorKind::InvalidArgument,
        200 | 209 | 218 | 300 => ErrorKind::Compile,
        900..=908 => ErrorKind::Capture,
        700 | 710 | 719 | 702 | 214 => ErrorKind::DeviceFault,
        _ => ErrorKind::Other,
    }
}

/// Classifies a `CUresult` value (CUDA driver API numbering).
pub(crate) fn classify_cuda(code: i32) -> ErrorKind {
    match code {
        2 => ErrorKind::OutOfMemory,
        801 => ErrorKind::NotSupported,
        100 | 34 | 35 => ErrorKind::NoDevice,
        1 | 101 | 400 | 701 | 9 => ErrorKind::InvalidArgument,
        200 | 209 | 218 | 222 | 300 => ErrorKind::Compile,
        900..=908 => ErrorKind::Capture,
        700 | 710 | 714 | 715 | 716 | 717 | 719 | 214 => ErrorKind::DeviceFault,
        _ => ErrorKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_operation_code_and_detail() {
        let err = HipError {
            op: "hipMalloc",
            code: 2,
            name: "hipErrorOutOfMemory".into(),
            api: Api::Hip,
            kind: classify_hip(2),
            detail: None,
        }
        .with_detail("asked for 1024 bytes");
        assert_eq!(
            err.to_string(),
            "hipMalloc failed with hipErrorOutOfMemory (2): asked for 1024 bytes"
        );
        assert!(err.is_out_of_memory());
    }

    #[test]
    fn classification_separates_common_failures() {
        assert_eq!(classify_hip(801), ErrorKind::NotSupported);
        assert_eq!(classify_hip(100), ErrorKind::NoDevice);
        assert_eq!(classify_hip(901), ErrorKind::Capture);
        assert_eq!(classify_cuda(2), ErrorKind::OutOfMemory);
        assert_eq!(classify_cuda(218), ErrorKind::Compile);
        assert_eq!(classify_cuda(12345), ErrorKind::Other);
    }
}
