//! Token generation for Llama, Qwen3, Qwen3-MoE and Gemma 3: model, KV cache, sampler and tokenizer.
//!
//! - [`backend`]: the compute interface and the CPU backend with fused quantized kernels.
//! - [`model`]: a model's weights, shared, and the per-architecture forward pass of a step.
//! - [`context`]: the KV cache and activations of a set of sequences; [`batch`]: one step's
//!   rows (sequence, position, prefill or decode, what each wants back).
//! - [`session`]: one sequence over a model and a context, a prompt or a token at a time.
//! - [`kv`]: the paged KV cache's books: blocks under a byte budget, block tables, prefix
//!   sharing and the prefix cache.
//! - [`tokenizer`]: SentencePiece-style and byte-level BPE tokenizers built from GGUF metadata.
//! - [`sampler`]: greedy, temperature, top-k and top-p sampling with a seed.
//! - [`generate`]: prefill, then decode, streaming tokens; [`generate_many`]: several prompts
//!   at once through one context's sequences, taking turns.
//! - [`device`]: `--device auto|cpu|gpu`; [`memory`]: bytes per purpose.
//! - [`environment`]: the `HIPDECODE_*` variables, checked at start-up.
//! - [`layout`]: every buffer a model needs, by tag, for given bounds: what the load allocates
//!   and what the offload planner prices.
//! - [`fuzzing`]: the hostile-input harnesses of the fuzz targets in `fuzz/`.
//!
//! The `hipdecode` command line is the `hipdecode` package (`crates/cli`) and its server the
//! `serve` crate; docs/decode.md describes the design, the tolerances against the reference
//! and the measured speed.

pub mod backend;
pub mod batch;
pub mod budget_run;
pub mod chat;
pub mod chat_template;
pub mod context;
pub mod device;
pub mod engine;
pub mod environment;
pub mod error;
pub mod error_report;
pub mod fuzzing;
pub mod generate;
pub mod generate_many;
pub mod kv;
pub mod layout;
pub mod link_probe;
pub mod managed_probe;
pub mod memory;
pub mod model;
pub mod nll;
pub mod quant;
pub mod sampler;
pub mod scheduler;
pub mod selftest;
pub mod session;
pub mod split_session;
pub mod stop_strings;
pub mod tokenizer;

pub use error::{DecodeError, Result};
pub use memory::{MemoryReport, MemoryTag};

pub use gguf_loader;
pub use gguf_loader::GgufFile;

/// Opens (memory-maps) a GGUF model file, naming the path in the error. Shared, because
/// backends that read weights in place keep the mapping alive.
pub fn open_model(path: &std::path::Path) -> Result<std::sync::Arc<GgufFile>> {
    GgufFile::open(path)
        .map(std::sync::Arc::new)
        .map_err(|source| DecodeError::Model {
            path: path.to_path_buf(),
            source,
        })
}

/// The README's examples, run as doc tests so the README stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
