//! Helpers for tests that need a GPU (this crate's and other crates').
//!
//! A GPU test asks [`device_or_skip`] for a device. Without a usable GPU it prints
//! `SKIP <test>: <reason>` to stderr and the test returns early, so a machine without a GPU still
//! passes `cargo test`. On a machine that is meant to have one (CI on a GPU runner, the
//! verification run on real hardware), setting `HIPDECODE_REQUIRE_GPU=1` turns every such skip
//! into a panic carrying the same reason, so a broken driver cannot make the GPU tests pass
//! silently.

use crate::device::Device;
use crate::platform::Platform;

/// Environment variable that turns a GPU-test skip into a failure: `1` requires a GPU; unset,
/// empty or `0` allows skipping.
pub const REQUIRE_GPU_VAR: &str = "HIPDECODE_REQUIRE_GPU";

/// Set to 1 where the vendor GEMM library is installed (the verification machine): its tests,
/// and the prefill tests that expect it in use, then fail instead of skipping.
pub const REQUIRE_BLAS_VAR: &str = "HIPDECODE_REQUIRE_BLAS";

/// Reads a `0`/`1` switch: unset, empty and `0` are off, `1` is on, anything else is refused with
/// a message naming the accepted values.
pub fn env_switch(var: &str) -> Result<bool, String> {
    parse_switch(var, std::env::var(var).ok().as_deref())
}

fn parse_switch(var: &str, value: Option<&str>) -> Result<bool, String> {
    match value.map(str::trim) {
        None | Some("") | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(format!(
            "{var}={other:?} is not understood; use 1 (required) or 0 / empty / unset (may skip)"
        )),
    }
}

/// The first usable GPU for test `test_name`, or `None` after printing `SKIP <test_name>:
/// <reason>` to stderr (the caller then returns early). For tests only.
///
/// # Panics
/// When `HIPDECODE_REQUIRE_GPU=1` and no GPU is usable (the message says why), or when that
/// variable holds a value other than empty, `0` or `1`.
pub fn device_or_skip(test_name: &str) -> Option<Device> {
    let required = env_switch(REQUIRE_GPU_VAR).unwrap_or_else(|e| panic!("{test_name}: {e}"));
    let platform = Platform::detect();
    match platform.device(0) {
        Ok(device) => Some(device),
        Err(e) => {
            let reason = platform.unusable_reason().unwrap_or_else(|| e.to_string());
            if required {
                panic!("{test_name}: {REQUIRE_GPU_VAR}=1 but no GPU is usable: {reason}");
            }
            eprintln!("SKIP {test_name}: {reason}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switch_accepts_only_zero_one_and_empty() {
        assert_eq!(parse_switch("V", None), Ok(false));
        assert_eq!(parse_switch("V", Some("")), Ok(false));
        assert_eq!(parse_switch("V", Some("0")), Ok(false));
        assert_eq!(parse_switch("V", Some("1")), Ok(true));
        let err = parse_switch("V", Some("yes")).expect_err("not a switch value");
        assert!(err.contains("V=\"yes\"") && err.contains("use 1"), "{err}");
    }
}
