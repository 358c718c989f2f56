//! Allocator set-ups shared by the criterion benches and the CPU-time example, so they all
//! measure the same warm state.

// Each bench or example that includes this module uses only part of it.
#![allow(dead_code)]

use std::sync::Arc;

use rocm_alloc::devices::sim::SimDevice;
use rocm_alloc::{Allocator, AllocatorConfig, StreamId, Tag};

/// An allocator on a simulated discrete device of `capacity` bytes, ignoring the environment.
pub fn sim_allocator(capacity: u64) -> Allocator {
    Allocator::new(
        Arc::new(SimDevice::discrete(capacity)),
        AllocatorConfig {
            read_env: false,
            ..Default::default()
        },
    )
    .expect("a simulated device accepts the default configuration")
}

/// Like [`sim_allocator`], with the default stream and a second stream of the device.
pub fn sim_allocator_two_streams(capacity: u64) -> (Allocator, [StreamId; 2]) {
    let device = Arc::new(SimDevice::discrete(capacity));
    let side = device.create_stream();
    let alloc = Allocator::new(
        device,
        AllocatorConfig {
            read_env: false,
            ..Default::default()
        },
    )
    .expect("a simulated device accepts the default configuration");
    (alloc, [StreamId::DEFAULT, side])
}

/// A 64 GiB simulated allocator whose free lists already hold a realistic mix: live blocks of
/// mixed sizes around the free ones being recycled.
pub fn warm_allocator() -> Allocator {
    let alloc = sim_allocator(64 << 30);
    let keep: Vec<_> = (0..64u64)
        .map(|i| {
            alloc
                .raw_alloc(512 * (1 + i % 16), StreamId::DEFAULT, Tag::Activations)
                .expect("the simulated device has room")
        })
        .collect();
    for p in keep.iter().step_by(2) {
        alloc.raw_free(*p).expect("a pointer we just allocated");
    }
    // The other half stays live for the allocator's lifetime.
    alloc
}
