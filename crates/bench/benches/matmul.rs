//! The CPU matrix kernels on Gemma 3 270M's own tensors, one per storage format it uses:
//! a single-token product (decode) and a 16-token batch (prefill), fast and exact paths.
//! Throughput is in weight elements per second. Skips with a message when the model is absent.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use decode::backend::cpu::kernels::{matmul, MatrixRef, Precision};

fn kernels(c: &mut Criterion) {
    // The models folder the tests and `cargo xtask fetch-model` use.
    let path = decode::gguf_loader::paths::gemma3_270m_path();
    let Ok(file) = decode::open_model(&path) else {
        eprintln!(
            "skipping: {} is absent (cargo xtask fetch-model gemma3-270m)",
            path.display()
        );
        return;
    };
    let tensors = [
        "blk.0.ffn_gate.weight",    // Q5_0 2048 x 640
        "blk.0.attn_output.weight", // Q4_K 640 x 1024
        "blk.0.ffn_down.weight",    // Q6_K 640 x 2048
        "blk.0.attn_v.weight",      // Q8_0 256 x 640
        "token_embd.weight",        // Q8_0 262144 x 640 (the tied output projection)
    ];
    let mut group = c.benchmark_group("matmul");
    group.sample_size(10);
    for name in tensors {
        let info = file.tensor(name).expect("tensor in the Gemma file");
        let format = info.ggml_type;
        assert!(decode::quant::is_supported(format), "{name} is {format}");
        let (cols, rows) = (info.dims[0] as usize, info.dims[1] as usize);
        let w = MatrixRef {
            format,
            data: file.tensor_data(info),
            rows,
            cols,
        };
        for n_tok in [1usize, 16] {
            if rows > 100_000 && n_tok > 1 {
                continue; // the output projection only ever runs for one token
            }
            let x: Vec<f32> = (0..n_tok * cols)
                .map(|i| ((i * 7919) % 201) as f32 / 100.0 - 1.0)
                .collect();
            let mut out = vec![0f32; n_tok * rows];
            let mut scratch = Vec::new();
            group.throughput(Throughput::Elements((rows * cols * n_tok) as u64));
            for precision in [Precision::Fast, Precision::Exact] {
                let id = format!("{name} {} x{n_tok} {precision:?}", format.name());
                group.bench_function(id, |b| {
                    b.iter(|| matmul(w, &x, n_tok, &mut out, precision, &mut scratch))
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
