//! Shared helper for GPU tests: the device, or a printed reason to skip.

use hip_ffi::{Device, Platform};

/// The first GPU, or `None` after printing `skipping: <reason>` (the test then returns early).
pub fn gpu_or_skip(test: &str) -> Option<Device> {
    match Platform::default_device() {
        Ok(device) => Some(device),
        Err(reason) => {
            eprintln!("skipping: {test}: no GPU found ({reason})");
            None
        }
    }
}
