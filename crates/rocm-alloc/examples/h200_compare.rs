//! Times this allocator on the HIP backend (CUDA on NVIDIA) with the same patterns, sizes and
//! loop counts as `h200/pytorch_alloc.cpp` does for PyTorch's caching allocator, so the two can
//! be compared in one run. Prints `RESULT,<impl>,<pattern>,<value>,<unit>` lines.
//!
//! Usage: `h200_compare [iterations] [runs]` (defaults 200000 and 7).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use rocm_alloc::devices::hip::HipDevice;
use rocm_alloc::{Allocator, AllocatorConfig, LimitSpec, RawDevice, StreamId, Tag};

/// xorshift64*, identical to the C++ harness's generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn size(&mut self) -> u64 {
        let exp = 9 + self.next() % 18;
        let base = 1u64 << exp;
        base + self.next() % base
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

const SIZES: [(&str, u64); 3] = [("4KiB", 4096), ("1MiB", 1 << 20), ("64MiB", 64 << 20)];

fn main() {
    let mut args = std::env::args().skip(1);
    let iters: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let runs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let device = match HipDevice::first() {
        Ok(d) => Arc::new(d),
        Err(reason) => {
            eprintln!("no GPU: {reason}");
            std::process::exit(2);
        }
    };
    println!("INFO,ours,device,{},", device.name());
    let alloc = Allocator::new(
        device.clone(),
        AllocatorConfig {
            read_env: false,
            ..Default::default()
        },
    )
    .expect("allocator");
    let s = StreamId::DEFAULT;

    for (name, size) in SIZES {
        alloc
            .raw_free(alloc.raw_alloc(size, s, Tag::Activations).unwrap())
            .unwrap();
        let raw: Vec<f64> = (0..runs)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..iters {
                    let p = alloc
                        .raw_alloc(black_box(size), s, Tag::Activations)
                        .unwrap();
                    alloc.raw_free(black_box(p)).unwrap();
                }
                t.elapsed().as_nanos() as f64 / iters as f64
            })
            .collect();
        println!("RESULT,ours,hit_raw_{name},{:.1},ns/pair", median(raw));
        let raii: Vec<f64> = (0..runs)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..iters {
                    let a = alloc.alloc(black_box(size), s, Tag::Activations).unwrap();
                    black_box(a.ptr());
                }
                t.elapsed().as_nanos() as f64 / iters as f64
            })
            .collect();
        println!("RESULT,ours,hit_raii_{name},{:.1},ns/pair", median(raii));
    }

    churn(&alloc, iters, runs, "");
    let unbounded = Allocator::new(
        device.clone(),
        AllocatorConfig {
            read_env: false,
            cache_limit: Some(LimitSpec::Unbounded),
            ..Default::default()
        },
    )
    .expect("allocator");
    churn(&unbounded, iters, runs, "_unbounded_cache");
    drop(unbounded);

    // Raw device cost, for the cost model: malloc then free, median of 5.
    for (name, size) in [("2MiB", 2u64 << 20), ("20MiB", 20 << 20), ("1GiB", 1 << 30)] {
        let mut m = Vec::new();
        let mut f = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let p = device.malloc(size).unwrap();
            m.push(t.elapsed().as_nanos() as f64 / 1000.0);
            let t = Instant::now();
            // SAFETY: `p` came from this device's malloc just above, no work uses it, and it
            // is freed once.
            unsafe { device.free(p).unwrap() };
            f.push(t.elapsed().as_nanos() as f64 / 1000.0);
        }
        println!("RESULT,device,malloc_{name},{:.1},us", median(m));
        println!("RESULT,device,free_{name},{:.1},us", median(f));
    }
}

/// Random-size churn over a window of 256 live allocations, identical to the C++ harness.
fn churn(alloc: &Allocator, iters: u64, runs: usize, suffix: &str) {
    let s = StreamId::DEFAULT;
    let before = alloc.stats();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut live: Vec<Option<u64>> = vec![None; 256];
    let mut pass = |n: u64| {
        for _ in 0..n {
            let slot = (rng.next() % 256) as usize;
            if let Some(p) = live[slot].take() {
                alloc.raw_free(p).unwrap();
            }
            live[slot] = Some(alloc.raw_alloc(rng.size(), s, Tag::Activations).unwrap());
        }
    };
    pass(iters);
    let warm = alloc.stats();
    let churn: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            pass(iters);
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    let after = alloc.stats();
    println!(
        "RESULT,ours,churn_window256{suffix},{:.1},ns/op",
        median(churn)
    );
    println!(
        "RESULT,ours,churn_device_allocs_timed{suffix},{},count",
        after.device_allocs - warm.device_allocs
    );
    println!(
        "RESULT,ours,churn_device_allocs_warmup{suffix},{},count",
        warm.device_allocs - before.device_allocs
    );
    println!(
        "RESULT,ours,churn_peak_reserved_MiB{suffix},{},MiB",
        after.peak_reserved_bytes >> 20
    );
    for p in live.iter().flatten() {
        alloc.raw_free(*p).unwrap();
    }
    drop(live);

    alloc.clear_cache().expect("clear");
}
