use decode::backend::host_q8::{matvec_rows, HostActivations};
use decode::gguf_loader::GgmlType;
use std::time::Instant;
fn main() {
    for (format, tsz) in [(GgmlType::Q4K, 144usize), (GgmlType::Q6K, 210)] {
        let (rows, cols) = (14336usize, 4096usize);
        let bytes = rows * cols / 256 * tsz;
        let mut data = vec![0u8; bytes];
        let mut s = 1u64;
        for b in data.iter_mut() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
            *b = (s >> 33) as u8;
        }
        let x: Vec<f32> = (0..cols).map(|i| (i % 17) as f32 * 0.1 - 0.8).collect();
        let mut a = HostActivations::default();
        a.quantize(&x).unwrap();
        let mut out = vec![0f32; rows];
        for _ in 0..3 {
            matvec_rows(format, &data, cols, 0..rows, &a, &mut out).unwrap();
        }
        let n = 20;
        let t = Instant::now();
        for _ in 0..n {
            matvec_rows(format, &data, cols, 0..rows, &a, &mut out).unwrap();
        }
        let dt = t.elapsed().as_secs_f64() / n as f64;
        println!(
            "{format:?} {rows}x{cols}: {:.2} ms, {:.2} GB/s, threads {}",
            dt * 1e3,
            bytes as f64 / dt / 1e9,
            rayon::current_num_threads()
        );
    }
}
