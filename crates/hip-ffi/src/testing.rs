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
use knobs::Knob;

/// Whether a test switch (`HIPDECODE_REQUIRE_*`) is on.
///
/// # Panics
/// When the variable holds a value other than empty, `0` or `1`, naming the test.
pub fn required(switch: &Knob<bool>, test_name: &str) -> bool {
    switch.read().unwrap_or_else(|e| panic!("{test_name}: {e}"))
}

/// The first usable GPU for test `test_name`, or `None` after printing `SKIP <test_name>:
/// <reason>` to stderr (the caller then returns early). For tests only.
///
/// # Panics
/// When `HIPDECODE_REQUIRE_GPU=1` and no GPU is usable (the message says why), or when that
/// variable holds a value other than empty, `0` or `1`.
pub fn device_or_skip(test_name: &str) -> Option<Device> {
    let switch = &crate::knobs::REQUIRE_GPU;
    let required = required(switch, test_name);
    let platform = Platform::detect();
    match platform.device(0) {
        Ok(device) => Some(device),
        Err(e) => {
            let reason = platform.unusable_reason().unwrap_or_else(|| e.to_string());
            if required {
                panic!(
                    "{test_name}: {}=1 but no GPU is usable: {reason}",
                    switch.name
                );
            }
            eprintln!("SKIP {test_name}: {reason}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use knobs::Env;

    #[test]
    fn the_require_switch_accepts_only_zero_one_and_empty() {
        let knob = &crate::knobs::REQUIRE_GPU;
        let value = |v: &str| knob.value_of(v);
        assert_eq!(knob.value(&Env::default()), Ok(false));
        assert_eq!(value(""), Ok(false));
        assert_eq!(value("0"), Ok(false));
        assert_eq!(value("1"), Ok(true));
        let err = value("yes").expect_err("not a switch value").to_string();
        assert!(
            err.contains("HIPDECODE_REQUIRE_GPU=\"yes\"") && err.contains("use 1"),
            "{err}"
        );
    }
}
