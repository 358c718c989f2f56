//! Random-size churn: a window of live allocations with log-uniform sizes from 512 B to 64 MiB,
//! one random slot replaced per iteration, on `SimDevice` with free raw calls. Measures the
//! allocator's own cost, misses, splits, merges and trims included.

mod support;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rocm_alloc::{Allocation, Tag};

/// xorshift64*: deterministic and dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn size(&mut self) -> u64 {
        // 2^9 .. 2^26 bytes, log-uniform, with a random mantissa.
        let exp = 9 + self.next() % 18;
        let base = 1u64 << exp;
        base + self.next() % base
    }
}

fn churn(c: &mut Criterion) {
    let (alloc, streams) = support::sim_allocator_two_streams(1 << 40);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut live: Vec<Option<Allocation>> = (0..256).map(|_| None).collect();
    c.bench_function("churn/window256_512B-64MiB", |b| {
        b.iter(|| {
            let slot = (rng.next() % live.len() as u64) as usize;
            live[slot] = None;
            let s = streams[(rng.next() % 2) as usize];
            let a = alloc.alloc(rng.size(), s, Tag::Activations).unwrap();
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
