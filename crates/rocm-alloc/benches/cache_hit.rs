//! Cache-hit path: one allocation and its free, served entirely from the cache of a warm
//! allocator on `SimDevice` (the device is never called). Target: at most 150 ns per pair.

mod support;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rocm_alloc::{StreamId, Tag};
use support::warm_allocator;

fn cache_hit(c: &mut Criterion) {
    let alloc = warm_allocator();
    let stream = StreamId::DEFAULT;
    for size in [4096u64, 1 << 20, 64 << 20] {
        drop(alloc.alloc(size, stream, Tag::Activations).unwrap());
    }
    let warm_device_allocs = alloc.stats().device_allocs;
    for (name, size) in [
        ("raii_4KiB", 4096u64),
        ("raii_1MiB", 1 << 20),
        ("raii_64MiB", 64 << 20),
    ] {
        c.bench_function(&format!("cache_hit/{name}"), |b| {
            b.iter(|| {
                let a = alloc
                    .alloc(black_box(size), stream, Tag::Activations)
                    .unwrap();
                black_box(a.ptr());
            })
        });
    }
    c.bench_function("cache_hit/raw_4KiB", |b| {
        b.iter(|| {
            let p = alloc
                .raw_alloc(black_box(4096), stream, Tag::Activations)
                .unwrap();
            alloc.raw_free(black_box(p)).unwrap();
        })
    });
    assert_eq!(
        alloc.stats().device_allocs,
        warm_device_allocs,
        "the timed loops never reached the device"
    );
}

criterion_group!(benches, cache_hit);
criterion_main!(benches);
