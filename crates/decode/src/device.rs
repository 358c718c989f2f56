//! Choosing where a model runs.

use crate::error::{DecodeError, Result};
use std::path::Path;

/// What the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceRequest {
    /// A GPU when one is present and usable, else the CPU.
    #[default]
    Auto,
    Cpu,
    Gpu,
}

impl std::str::FromStr for DeviceRequest {
    type Err = DecodeError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(DeviceRequest::Auto),
            "cpu" => Ok(DeviceRequest::Cpu),
            "gpu" => Ok(DeviceRequest::Gpu),
            other => Err(DecodeError::InvalidArgument(format!(
                "--device '{other}' is not one of auto, cpu, gpu"
            ))),
        }
    }
}

/// Where the model will run, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceChoice {
    pub note: Option<String>,
}

/// Whether a GPU driver node is present (AMD's KFD, or NVIDIA's control device).
pub fn gpu_present() -> bool {
    Path::new("/dev/kfd").exists() || Path::new("/dev/nvidiactl").exists()
}

/// Resolves a request to the CPU backend, the only one that exists so far. Asking for the GPU
/// is an error that says so; `auto` falls back to the CPU and notes a GPU it had to pass over.
pub fn choose(request: DeviceRequest) -> Result<DeviceChoice> {
    match request {
        DeviceRequest::Cpu => Ok(DeviceChoice { note: None }),
        DeviceRequest::Gpu => Err(DecodeError::GpuUnavailable(if gpu_present() {
            "a GPU is present, but hipdecode's GPU decode backend has not been written yet".into()
        } else {
            "no GPU was found, and hipdecode's GPU decode backend has not been written yet".into()
        })),
        DeviceRequest::Auto => Ok(DeviceChoice {
            note: gpu_present().then(|| {
                "a GPU is present but the GPU decode backend does not exist yet; running on the CPU"
                    .to_string()
            }),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_request_is_a_clear_error_and_auto_falls_back() {
        let e = choose(DeviceRequest::Gpu).unwrap_err().to_string();
        assert!(e.contains("--device cpu"), "{e}");
        assert!(choose(DeviceRequest::Auto).is_ok());
        assert!("tpu".parse::<DeviceRequest>().is_err());
    }
}
