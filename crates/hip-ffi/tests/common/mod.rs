//! Shared helper for GPU tests: the device, or a printed reason to skip (a panic when
//! `HIPDECODE_REQUIRE_GPU=1`).

pub use hip_ffi::testing::device_or_skip as gpu_or_skip;
