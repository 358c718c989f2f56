//! Cache-hit cost in thread CPU time (from /proc/thread-self/schedstat), which unlike wall
//! time is not inflated when other processes share the cores. Linux only.

#[path = "../benches/support/mod.rs"]
mod support;

use std::hint::black_box;

use rocm_alloc::{StreamId, Tag};

fn cpu_ns() -> u64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").expect("Linux schedstat");
    s.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .expect("schedstat run time")
}

fn main() {
    let alloc = support::warm_allocator();
    let n = 5_000_000u64;
    for size in [4096u64, 1 << 20, 64 << 20] {
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = cpu_ns();
            for _ in 0..n {
                let a = alloc
                    .alloc(black_box(size), StreamId::DEFAULT, Tag::Activations)
                    .unwrap();
                black_box(a.ptr());
            }
            best = best.min((cpu_ns() - t) as f64 / n as f64);
        }
        let mut best_raw = f64::MAX;
        for _ in 0..5 {
            let t = cpu_ns();
            for _ in 0..n {
                let p = alloc
                    .raw_alloc(black_box(size), StreamId::DEFAULT, Tag::Activations)
                    .unwrap();
                alloc.raw_free(black_box(p)).unwrap();
            }
            best_raw = best_raw.min((cpu_ns() - t) as f64 / n as f64);
        }
        println!("size {size:>9}: raii {best:6.1} ns/pair, raw {best_raw:6.1} ns/pair (thread CPU time, best of 5)");
    }
}
