//! Opening the real Gemma 3 270M file and indexing every tensor (target: ≤ 10 ms warm, with no
//! copy of tensor data). Skips with a message when the model has not been fetched.

use criterion::{criterion_group, criterion_main, Criterion};
use gguf_loader::paths::gemma3_270m_path;
use gguf_loader::GgufFile;
use std::hint::black_box;

fn open_index(c: &mut Criterion) {
    let path = gemma3_270m_path();
    if !path.exists() {
        eprintln!(
            "open_index: skipped, {} is absent (run `cargo xtask fetch-model gemma3-270m`)",
            path.display()
        );
        return;
    }
    c.bench_function("open_index/gemma3-270m-q4_k_m", |b| {
        b.iter(|| {
            let f = GgufFile::open(&path).unwrap();
            // Touch the index: every tensor's borrowed data slice, and the tokenizer strings.
            let bytes: u64 = f
                .tensors()
                .iter()
                .map(|t| f.tensor_data(t).len() as u64)
                .sum();
            black_box((
                bytes,
                f.get_str_slice("tokenizer.ggml.tokens").unwrap().len(),
            ));
            f
        })
    });
}

criterion_group!(benches, open_index);
criterion_main!(benches);
