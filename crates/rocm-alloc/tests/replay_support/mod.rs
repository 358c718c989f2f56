//! Generators of synthetic allocation traces, and the committed traces they made.
//!
//! Every trace under `tests/traces/` comes from a function here; the tests check that the
//! committed file is byte for byte what the function writes today, so a file and its recipe
//! cannot drift apart. To rewrite the files after changing a recipe:
//! `HIPDECODE_WRITE_TRACES=1 cargo test -p rocm-alloc --test replay`.

#![allow(dead_code)]

use std::path::PathBuf;

use rocm_alloc::trace::{TraceConfig, TraceDevice, TraceFile, TraceRecord, TraceUma};
use rocm_alloc::Tag;

/// Nanoseconds between consecutive events of a generated trace. Replay uses times only to
/// order events, so the value is arbitrary; it is small to keep the numbers short.
pub const DT: u64 = 500;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// An allocation made by a generator: (id, requested size, tag, stream).
#[derive(Clone, Copy, Debug)]
pub struct A {
    pub id: u64,
    pub size: u64,
    pub tag: Tag,
    pub stream: u64,
}

/// Writes trace lines, with `repeat` lines for identical blocks (or, with `explicit`, the
/// repetitions written out, to check that both forms are the same events).
pub struct Gen {
    pub lines: Vec<TraceRecord>,
    t: u64,
    next_id: u64,
    explicit: bool,
}

impl Gen {
    pub fn new(explicit: bool) -> Gen {
        Gen {
            lines: Vec::new(),
            t: 0,
            next_id: 1,
            explicit,
        }
    }

    pub fn alloc(&mut self, size: u64, tag: Tag, stream: u64) -> A {
        self.t += DT;
        let id = self.next_id;
        self.next_id += 1;
        self.lines.push(TraceRecord::Alloc {
            t: self.t,
            id,
            size,
            block: None,
            tag,
            stream,
        });
        A {
            id,
            size,
            tag,
            stream,
        }
    }

    pub fn free(&mut self, a: A) {
        self.t += DT;
        self.lines.push(TraceRecord::Free {
            t: self.t,
            id: a.id,
            size: a.size,
            tag: a.tag,
            stream: a.stream,
        });
    }

    pub fn use_on(&mut self, a: A, stream: u64) {
        self.t += DT;
        self.lines.push(TraceRecord::Use {
            t: self.t,
            id: a.id,
            stream,
        });
    }

    pub fn weights(&mut self, bytes: u64) {
        self.t += DT;
        self.lines.push(TraceRecord::Weights { t: self.t, bytes });
    }

    /// `body` happens `1 + times` times. It must free everything it allocates, since the
    /// repetitions reuse its allocation ids.
    pub fn repeat(&mut self, times: u64, body: &dyn Fn(&mut Gen)) {
        let (start, t_before, id_before) = (self.lines.len(), self.t, self.next_id);
        body(self);
        let period = self.t - t_before;
        if times == 0 || period == 0 {
            return;
        }
        if self.explicit {
            for r in 1..=times {
                self.t = t_before + r * period;
                self.next_id = id_before;
                body(self);
            }
        } else {
            self.lines.push(TraceRecord::Repeat {
                t: t_before + DT + period,
                lines: (self.lines.len() - start) as u64,
                times,
            });
            self.t = t_before + (times + 1) * period;
        }
    }
}

/// The shapes of the synthetic decode: an 8B Llama-like model (32 layers, hidden 4096, 32
/// query heads, 8 KV heads of 128, FFN 14336, vocabulary 128256) with 4-bit weights.
pub struct DecodeShape {
    pub layers: u64,
    /// Weight bytes per layer, then of the embedding and the output projection.
    pub layer_weights: u64,
    pub embedding: u64,
    pub output: u64,
    /// KV cache capacity in tokens (f16 K and V, 8 heads of 128: 4 KiB per token per layer).
    pub kv_tokens: u64,
    /// Prompt tokens per prefill chunk.
    pub chunk: u64,
    /// The chat: (prompt tokens, generated tokens) per turn.
    pub turns: Vec<(u64, u64)>,
    /// Whether the runtime reports its weight bytes to the allocator (`set_weight_bytes`).
    pub report_weights: bool,
}

impl DecodeShape {
    /// The committed trace's shape: a six-turn chat that fills most of an 8192-token cache.
    pub fn chat_8b() -> DecodeShape {
        DecodeShape {
            layers: 32,
            // 4.50 GB in all: 32 layers of 118 MB, a 295 MB embedding (Q4_K) and a 430 MB
            // output projection (Q6_K), as a Q4_K_M file of an 8B Llama has.
            layer_weights: 118_000_000,
            embedding: 295_000_000,
            output: 430_000_000,
            kv_tokens: 8192,
            chunk: 512,
            turns: vec![
                (1800, 128),
                (700, 128),
                (1500, 128),
                (900, 128),
                (1300, 128),
                (1000, 128),
            ],
            report_weights: false,
        }
    }

    pub fn weight_bytes(&self) -> u64 {
        self.layers * self.layer_weights + self.embedding + self.output
    }

    pub fn kv_bytes(&self) -> u64 {
        self.layers * self.kv_tokens * 4 * KIB
    }
}

/// One layer of one step over `n` tokens at context `ctx` (`scores_ctx` sizes the attention
/// scores: the context in prefill, the whole cache in decode), as an eager runtime runs it:
/// every op's output is a new allocation, and an op's inputs are freed once two newer results
/// exist.
fn layer(g: &mut Gen, n: u64, scores_ctx: u64) {
    let f32s = |elems: u64| elems * 4;
    let ops = [
        (f32s(n * 4096), Tag::Activations),        // attention norm
        (f32s(n * 6144), Tag::Activations),        // q, k and v
        (32 * n * scores_ctx * 2, Tag::Workspace), // f16 attention scores, all heads
        (f32s(n * 4096), Tag::Activations),        // attention output
        (f32s(n * 4096), Tag::Activations),        // output projection + residual
        (f32s(n * 4096), Tag::Activations),        // FFN norm
        (f32s(n * 28672), Tag::Activations),       // gate and up, then SiLU(gate) * up
        (f32s(n * 4096), Tag::Activations),        // down projection + residual
    ];
    let mut held: Vec<A> = Vec::new();
    for (size, tag) in ops {
        held.push(g.alloc(size, tag, 1));
        if held.len() > 2 {
            let a = held.remove(0);
            g.free(a);
        }
    }
    for a in held {
        g.free(a);
    }
}

/// The synthetic decode trace (the committed `chat-8b-eager.jsonl`): weights loaded once on
/// the compute stream (1), the KV cache allocated once for its whole capacity, then a chat.
/// Each turn's prompt is staged by a copy stream (2) into a buffer the compute stream reads
/// (a `use`, so its free is a cross-stream free), prefilled in chunks, then decoded token by
/// token. Every op of every layer allocates its output and frees its inputs, as an eager
/// runtime does; the attention scores of a prefill chunk grow with the context, so each chunk
/// asks for a larger block than any freed before it. An allocator without a cache limit keeps
/// every one of them: the blow-up. Decode steps are identical (their scratch is sized for the
/// whole cache), and so are the layers of a step, so `repeat` lines keep the file small.
pub fn chat_8b_trace(shape: &DecodeShape, explicit: bool) -> TraceFile {
    let mut g = Gen::new(explicit);
    for _ in 0..shape.layers {
        g.alloc(shape.layer_weights, Tag::Weights, 1);
    }
    g.alloc(shape.embedding, Tag::Weights, 1);
    g.alloc(shape.output, Tag::Weights, 1);
    if shape.report_weights {
        g.weights(shape.weight_bytes());
    }
    for _ in 0..shape.layers {
        g.alloc(shape.kv_tokens * 4 * KIB, Tag::KvCache, 1);
    }
    let layers = shape.layers;
    let mut ctx = 0;
    for &(prompt, generated) in &shape.turns {
        let staged = g.alloc(prompt * 8 * KIB, Tag::OffloadStaging, 2);
        g.use_on(staged, 1);
        let mut left = prompt;
        while left > 0 {
            let n = left.min(shape.chunk);
            ctx += n;
            left -= n;
            let hidden = g.alloc(n * 4096 * 4, Tag::Activations, 1);
            g.repeat(layers - 1, &|g| layer(g, n, ctx));
            g.free(hidden);
        }
        g.free(staged);
        let kv_tokens = shape.kv_tokens;
        g.repeat(generated - 1, &|g| {
            let hidden = g.alloc(4096 * 4, Tag::Activations, 1);
            g.repeat(layers - 1, &|g| layer(g, 1, kv_tokens));
            g.free(hidden);
            let logits = g.alloc(128_256 * 4, Tag::Activations, 1);
            g.free(logits);
        });
        ctx += generated;
    }
    assert!(ctx <= shape.kv_tokens, "the chat overflows the KV cache");
    let note = format!(
        "synthetic: crates/rocm-alloc/tests/replay_support/mod.rs chat_8b_trace; an eager \
         runtime decoding an 8B 4-bit Llama ({} weight bytes, {} KV bytes), {} chat turns",
        shape.weight_bytes(),
        shape.kv_bytes(),
        shape.turns.len()
    );
    TraceFile::from_records(synthetic_device(), synthetic_config(), g.lines, Some(note))
}

/// The device a generated trace claims: none in particular; a Strix Halo with the 96 GiB
/// carve-out, which is what the synthetic runs stand for.
pub fn synthetic_device() -> TraceDevice {
    TraceDevice {
        name: "synthetic (no device)".to_string(),
        total: 96 << 30,
        usable: 112 << 30,
        uma: Some(TraceUma {
            carve_out: 96 << 30,
            gtt: 16 << 30,
            host_ram: 32 << 30,
        }),
    }
}

/// The limits a generated trace claims: the defaults of that device with no weights reported.
pub fn synthetic_config() -> TraceConfig {
    TraceConfig {
        memory_limit: Some(rocm_alloc::limits::uma_memory_limit(&rocm_alloc::UmaInfo {
            carve_out: 96 << 30,
            gtt: 16 << 30,
            host_ram: 32 << 30,
        })),
        cache_limit: Some(rocm_alloc::limits::DEFAULT_CACHE_LIMIT),
        cache_limit_explicit: false,
        weight_bytes: 0,
        trim_hot_window: rocm_alloc::DEFAULT_TRIM_HOT_WINDOW,
    }
}

/// A run that cannot fit a 16 GiB card (the committed `too-big-16g.jsonl`): 27 weight
/// tensors of 512 MiB (13.5 GiB), a 2 GiB KV cache, then a 1 GiB prefill buffer. Under the
/// card's default limit (90%, 14.4 GiB) the KV cache is refused: event 27, line 29. With no
/// limits the KV cache fits the 16 GiB and the prefill buffer is refused by the device:
/// event 28, line 30.
pub fn too_big_16g_trace() -> TraceFile {
    let mut g = Gen::new(false);
    for _ in 0..27 {
        g.alloc(512 * MIB, Tag::Weights, 1);
    }
    let kv = g.alloc(2048 * MIB, Tag::KvCache, 1);
    let scratch = g.alloc(1024 * MIB, Tag::Activations, 1);
    g.free(scratch);
    g.free(kv);
    let note = "synthetic: crates/rocm-alloc/tests/replay_support/mod.rs too_big_16g_trace; \
                13.5 GiB of weights and a 2 GiB KV cache, meant not to fit a 16 GiB card"
        .to_string();
    TraceFile::from_records(synthetic_device(), synthetic_config(), g.lines, Some(note))
}

/// Where the committed traces live.
pub fn traces_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/traces")
}

/// Checks that the committed file `name` is exactly `trace` written out, or rewrites it when
/// `HIPDECODE_WRITE_TRACES=1`.
pub fn check_committed(name: &str, trace: &TraceFile) {
    let path = traces_dir().join(name);
    let text = trace.to_text();
    let rewrite = rocm_alloc::knobs::WRITE_TRACES
        .read()
        .unwrap_or_else(|e| panic!("{e}"));
    if rewrite {
        std::fs::write(&path, &text).expect("write the trace");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; write it with HIPDECODE_WRITE_TRACES=1 cargo test -p rocm-alloc --test replay",
            path.display()
        )
    });
    assert!(
        committed == text,
        "{} is not what {name}'s generator writes today; if the recipe changed on purpose, \
         rewrite it with HIPDECODE_WRITE_TRACES=1 cargo test -p rocm-alloc --test replay",
        path.display()
    );
}
