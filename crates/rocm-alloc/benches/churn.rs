//! Random-size churn: a window of live allocations with log-uniform sizes from 512 B to 64 MiB,
//! one random slot replaced per iteration, on `SimDevice` with free raw calls. Measures the
//! allocator's own cost, misses, splits, merges and trims included.

mod support;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rand::Rng;
use rocm_alloc::{Allocation, Tag};
use test_support::rng::{seeded, StdRng};

/// 2^9 .. 2^26 bytes, log-uniform, with a random mantissa.
fn random_size(rng: &mut StdRng) -> u64 {
    let base = 1u64 << rng.random_range(9..27);
    base + rng.random_range(0..base)
}

fn churn(c: &mut Criterion) {
    let (alloc, streams) = support::sim_allocator_two_streams(1 << 40);
    let mut rng = seeded(0x9E37_79B9_7F4A_7C15);
    let mut live: Vec<Option<Allocation>> = (0..256).map(|_| None).collect();
    c.bench_function("churn/window256_512B-64MiB", |b| {
        b.iter(|| {
            let slot = rng.random_range(0..live.len());
            live[slot] = None;
            let s = streams[rng.random_range(0..2)];
            let a = alloc
                .alloc(random_size(&mut rng), s, Tag::Activations)
                .unwrap();
            black_box(a.ptr());
            live[slot] = Some(a);
        })
    });
    let s = alloc.stats();
    eprintln!(
        "churn: hits {} misses {} device allocs {} frees {} reserved {} cached {}",
        s.cache_hits,
        s.cache_misses,
        s.device_allocs,
        s.device_frees,
        s.reserved_bytes,
        s.cached_bytes
    );
}

criterion_group!(benches, churn);
criterion_main!(benches);
