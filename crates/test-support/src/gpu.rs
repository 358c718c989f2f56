//! One GPU test at a time within a test process.
//!
//! Tests of one binary run on parallel threads and share the device. Several things break when
//! two of them meet there:
//! - a test that ends unloads its kernel modules, which synchronizes the whole device, and that
//!   is illegal while another thread's stream is capturing a graph (seen on the H200 as
//!   `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`);
//! - allocations and copies of one test cannot interleave with another's capture on any
//!   runtime;
//! - tests that read device-wide free memory, or time a busy kernel, measure the others' work.
//!
//! So every GPU test takes [`gpu_lock`] first. Separate test binaries are separate processes;
//! each has its own lock, and `cargo test` runs binaries one after another.

use std::sync::{Mutex, MutexGuard, PoisonError};

pub use hip_ffi::testing::{device_or_skip, required};

static GPU: Mutex<()> = Mutex::new(());

/// Holds the device for the calling test until the guard drops.
///
/// A test that panicked while holding the lock poisons it; the next test takes it anyway,
/// because the failed test's device work ended with it and nothing shared is left half-done.
pub fn gpu_lock() -> MutexGuard<'static, ()> {
    GPU.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::gpu_lock;

    #[test]
    fn a_test_that_panicked_holding_the_lock_does_not_block_the_next() {
        let panicked = std::thread::spawn(|| {
            let _held = gpu_lock();
            panic!("a failing GPU test");
        })
        .join();
        assert!(panicked.is_err());
        drop(gpu_lock());
    }
}
