//! Synthetic models: real tensor shapes and names, random finite quantized weights, and a
//! synthetic tokenizer vocabulary, written with [`GgufWriter`] one tensor at a time.
//!
//! They stand in for models that are too large to download in tests (Llama 3.1 8B, Qwen3
//! 30B-A3B) and give small `tiny-*` models of every family for CI. Weight types follow
//! llama.cpp's Q4_K_M recipe, including its fallbacks for rows that are not a multiple of 256.

use crate::metadata::ValueType;
use crate::model::Architecture;
use crate::quant::GgmlType;
use crate::writer::{GgufWriter, PlannedTensor, Value};
use crate::GgufError;
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

/// The synthetic models `synth-model` and the tests can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Preset {
    /// Llama 3.1 8B shapes, Q4_K_M, about 4.9 GB.
    Llama3_8bQ4KM,
    /// Qwen3 30B-A3B shapes (128 experts, 8 used), Q4_K_M, about 18 GB.
    Qwen3_30bA3bQ4KM,
    /// Gemma 3 270M shapes and type mix, about 250 MB.
    Gemma3_270mQ4KM,
    TinyLlama,
    TinyQwen3,
    TinyQwen3Moe,
    TinyGemma3,
    /// Qwen2 / Qwen2.5: Qwen3 without the Q/K norms, with Q, K and V biases.
    TinyQwen2,
    /// Gemma 2: soft-capped attention scores and logits, every other layer sliding.
    TinyGemma2,
    /// Phi-3: Q, K and V fused in `attn_qkv`, gate and up fused in `ffn_up`.
    TinyPhi3,
    /// Phi-3 with LongRoPE (the 128k-context files): `rope_factors_long` and
    /// `rope_factors_short`, an original context of 48 and an attention factor.
    TinyPhi3LongRope,
    /// Llama with heads wider than `n_embd / n_head` (Mistral Nemo: 5120 wide, 32 heads of 128).
    TinyMistralNemo,
}

impl Preset {
    pub const ALL: [Preset; 12] = [
        Preset::Llama3_8bQ4KM,
        Preset::Qwen3_30bA3bQ4KM,
        Preset::Gemma3_270mQ4KM,
        Preset::TinyLlama,
        Preset::TinyQwen3,
        Preset::TinyQwen3Moe,
        Preset::TinyGemma3,
        Preset::TinyQwen2,
        Preset::TinyGemma2,
        Preset::TinyPhi3,
        Preset::TinyPhi3LongRope,
        Preset::TinyMistralNemo,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Preset::Llama3_8bQ4KM => "llama3-8b-q4_k_m",
            Preset::Qwen3_30bA3bQ4KM => "qwen3-30b-a3b-q4_k_m",
            Preset::Gemma3_270mQ4KM => "gemma3-270m-q4_k_m",
            Preset::TinyLlama => "tiny-llama",
            Preset::TinyQwen3 => "tiny-qwen3",
            Preset::TinyQwen3Moe => "tiny-qwen3moe",
            Preset::TinyGemma3 => "tiny-gemma3",
            Preset::TinyQwen2 => "tiny-qwen2",
            Preset::TinyGemma2 => "tiny-gemma2",
            Preset::TinyPhi3 => "tiny-phi3",
            Preset::TinyPhi3LongRope => "tiny-phi3-longrope",
            Preset::TinyMistralNemo => "tiny-mistral-nemo",
        }
    }

    pub fn from_name(name: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Small enough to write in tests (well under a megabyte or a few).
    pub fn is_tiny(self) -> bool {
        matches!(
            self,
            Preset::TinyLlama
                | Preset::TinyQwen3
                | Preset::TinyQwen3Moe
                | Preset::TinyGemma3
                | Preset::TinyQwen2
                | Preset::TinyGemma2
                | Preset::TinyPhi3
                | Preset::TinyPhi3LongRope
                | Preset::TinyMistralNemo
        )
    }

    /// The shapes and hyperparameters of the preset.
    pub fn spec(self) -> Spec {
        let llama3_8b = Spec {
            arch: Architecture::Llama,
            name: "Synthetic Llama 3.1 8B",
            n_layers: 32,
            n_embd: 4096,
            n_ff: 14336,
            n_head: 32,
            n_head_kv: 8,
            head_dim: 128,
            write_head_dim: false,
            vocab: 128_256,
            context_length: 131_072,
            rope_freq_base: 500_000.0,
            rms_eps: 1e-5,
            sliding_window: None,
            n_expert: 0,
            n_expert_used: 0,
            n_ff_expert: 0,
            tied_embeddings: false,
            llama3_rope_factors: true,
            attn_bias: false,
            softcaps: None,
            fused_projections: false,
            long_rope: None,
        };
        let qwen3_30b = Spec {
            arch: Architecture::Qwen3Moe,
            name: "Synthetic Qwen3 30B-A3B",
            n_layers: 48,
            n_embd: 2048,
            n_ff: 6144,
            n_head: 32,
            n_head_kv: 4,
            head_dim: 128,
            write_head_dim: true,
            vocab: 151_936,
            context_length: 40_960,
            rope_freq_base: 1_000_000.0,
            rms_eps: 1e-6,
            sliding_window: None,
            n_expert: 128,
            n_expert_used: 8,
            n_ff_expert: 768,
            tied_embeddings: false,
            llama3_rope_factors: false,
            attn_bias: false,
            softcaps: None,
            fused_projections: false,
            long_rope: None,
        };
        let gemma3_270m = Spec {
            arch: Architecture::Gemma3,
            name: "Synthetic Gemma 3 270M",
            n_layers: 18,
            n_embd: 640,
            n_ff: 2048,
            n_head: 4,
            n_head_kv: 1,
            head_dim: 256,
            write_head_dim: true,
            vocab: 262_144,
            context_length: 32_768,
            rope_freq_base: 1_000_000.0,
            rms_eps: 1e-6,
            sliding_window: Some(512),
            n_expert: 0,
            n_expert_used: 0,
            n_ff_expert: 0,
            tied_embeddings: true,
            llama3_rope_factors: false,
            attn_bias: false,
            softcaps: None,
            fused_projections: false,
            long_rope: None,
        };
        // The shape most tiny presets share: two dense layers, 256 wide, four query heads of
        // 64 over two K/V heads, a vocabulary of 640. Each keeps the rest of its base.
        let tiny = |base: &Spec| Spec {
            n_layers: 2,
            n_embd: 256,
            n_ff: 512,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            vocab: 640,
            context_length: 2048,
            n_expert: 0,
            n_expert_used: 0,
            n_ff_expert: 0,
            ..base.clone()
        };
        match self {
            Preset::Llama3_8bQ4KM => llama3_8b,
            Preset::Qwen3_30bA3bQ4KM => qwen3_30b,
            Preset::Gemma3_270mQ4KM => gemma3_270m,
            Preset::TinyLlama => Spec {
                name: "Synthetic tiny Llama",
                vocab: 512,
                ..tiny(&llama3_8b)
            },
            Preset::TinyQwen3 => Spec {
                arch: Architecture::Qwen3,
                name: "Synthetic tiny Qwen3",
                ..tiny(&qwen3_30b)
            },
            Preset::TinyQwen3Moe => Spec {
                name: "Synthetic tiny Qwen3 MoE",
                n_expert: 8,
                n_expert_used: 2,
                n_ff_expert: 256,
                ..tiny(&qwen3_30b)
            },
            Preset::TinyGemma3 => Spec {
                name: "Synthetic tiny Gemma 3",
                n_layers: 6,
                n_embd: 128,
                n_ff: 256,
                n_head: 2,
                n_head_kv: 1,
                head_dim: 128,
                vocab: 512,
                context_length: 2048,
                sliding_window: Some(8),
                ..gemma3_270m
            },
            Preset::TinyQwen2 => Spec {
                arch: Architecture::Qwen2,
                name: "Synthetic tiny Qwen2",
                write_head_dim: false,
                attn_bias: true,
                ..tiny(&qwen3_30b)
            },
            Preset::TinyGemma2 => Spec {
                arch: Architecture::Gemma2,
                name: "Synthetic tiny Gemma 2",
                n_layers: 4,
                rope_freq_base: 10_000.0,
                // Far below Gemma 2's 50 and 30, which random tiny weights never come near:
                // these caps bend the scores and logits the tests see, so a kernel that skips
                // one fails them.
                softcaps: Some((0.5, 1.0)),
                ..Preset::TinyGemma3.spec()
            },
            Preset::TinyPhi3 => Spec {
                arch: Architecture::Phi3,
                name: "Synthetic tiny Phi-3",
                // Phi-3 mini has as many K/V heads as query heads; medium groups them. The
                // tiny shape's two for four puts K and V at other row counts than Q in the
                // fused tensor.
                context_length: 4096,
                rope_freq_base: 10_000.0,
                llama3_rope_factors: false,
                fused_projections: true,
                ..tiny(&llama3_8b)
            },
            Preset::TinyPhi3LongRope => Spec {
                name: "Synthetic tiny Phi-3 with LongRoPE",
                context_length: 512,
                // Shorter than the tests' contexts on one side, longer on the other.
                // sqrt(1 + ln(512 / 48) / ln 48), as the converter derives it.
                long_rope: Some((48, 1.2694)),
                ..Preset::TinyPhi3.spec()
            },
            Preset::TinyMistralNemo => Spec {
                name: "Synthetic tiny Mistral Nemo",
                // 4 x 64 = 256 query outputs from a residual of 192: Q, K and V are wider than
                // the model and the output projection narrows them back, as in Nemo.
                n_embd: 192,
                write_head_dim: true,
                vocab: 512,
                rope_freq_base: 1_000_000.0,
                llama3_rope_factors: false,
                ..tiny(&llama3_8b)
            },
        }
    }
}

/// Shapes and hyperparameters of a synthetic model.
#[derive(Debug, Clone)]
pub struct Spec {
    pub arch: Architecture,
    pub name: &'static str,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Whether `attention.key_length`/`value_length` are written (they are when the head dim
    /// is not `n_embd / n_head`, and in every file of some converters).
    pub write_head_dim: bool,
    pub vocab: usize,
    pub context_length: usize,
    pub rope_freq_base: f32,
    pub rms_eps: f32,
    pub sliding_window: Option<usize>,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_expert: usize,
    /// No `output.weight`: the output projection reuses `token_embd.weight`.
    pub tied_embeddings: bool,
    /// Llama 3.1's `rope_freqs.weight` (per-dimension RoPE factors).
    pub llama3_rope_factors: bool,
    /// `attn_{q,k,v}.bias` beside their weights (Qwen2).
    pub attn_bias: bool,
    /// Gemma 2's `attn_logit_softcapping` and `final_logit_softcapping`.
    pub softcaps: Option<(f32, f32)>,
    /// Phi-3's fused tensors: `attn_qkv` (Q, K and V rows in that order) instead of
    /// `attn_{q,k,v}`, and `ffn_up` of twice the width (gate rows first) instead of
    /// `ffn_gate` and `ffn_up`.
    pub fused_projections: bool,
    /// Phi-3's LongRoPE: `rope_factors_long`/`short` tensors, with this original context
    /// (`rope.scaling.original_context_length`) and `rope.scaling.attn_factor`.
    pub long_rope: Option<(usize, f32)>,
}

/// llama.cpp's Q4_K_M rule: some layers get more bits for `attn_v` and `ffn_down`.
fn use_more_bits(layer: usize, n_layers: usize) -> bool {
    let first = n_layers / 8;
    match layer.checked_sub(first) {
        None => true,
        Some(since_first) => layer >= 7 * n_layers / 8 || since_first % 3 == 2,
    }
}

/// K-quants need rows that are a multiple of 256; llama.cpp falls back to a legacy type.
fn fit_row(ty: GgmlType, row: usize) -> GgmlType {
    if row.is_multiple_of(ty.block_size()) {
        return ty;
    }
    match ty {
        GgmlType::Q4K | GgmlType::Q5K => GgmlType::Q5_0,
        GgmlType::Q6K => GgmlType::Q8_0,
        _ => GgmlType::F32,
    }
}

/// How a planned tensor's bytes are produced.
enum Fill {
    /// Random quantized weights.
    Random,
    /// Norm weights around 1.
    Norm,
    /// Biases in ±0.5, ten times the weights' range: large enough that a bias left out moves
    /// the logits well past the tests' tolerances (a K bias alone barely does: softmax ignores
    /// a shift shared by every key, and only RoPE's rotation of it shows).
    Bias,
    /// Explicit f32 values.
    Values(Vec<f32>),
}

/// Plans the whole model: metadata (hyperparameters and tokenizer) and tensor layout.
pub fn plan(preset: Preset, seed: u64) -> Result<GgufWriter, GgufError> {
    let s = preset.spec();
    let mut w = GgufWriter::new();
    let arch = s.arch.name();
    let k = |suffix: &str| format!("{arch}.{suffix}");
    let u32v = |v: usize| Value::U32(v as u32);
    w.add("general.architecture", arch)?;
    w.add("general.type", "model")?;
    w.add("general.name", s.name)?;
    w.add(
        "general.description",
        format!(
            "hipdecode synth-model preset {} (seed {seed}); random weights",
            preset.name()
        ),
    )?;
    w.add("general.quantization_version", Value::U32(2))?;
    w.add("general.file_type", Value::U32(15))?; // LLAMA_FTYPE_MOSTLY_Q4_K_M
    w.add(k("context_length"), u32v(s.context_length))?;
    w.add(k("embedding_length"), u32v(s.n_embd))?;
    w.add(k("block_count"), u32v(s.n_layers))?;
    w.add(k("feed_forward_length"), u32v(s.n_ff))?;
    w.add(k("attention.head_count"), u32v(s.n_head))?;
    w.add(k("attention.head_count_kv"), u32v(s.n_head_kv))?;
    if s.write_head_dim {
        w.add(k("attention.key_length"), u32v(s.head_dim))?;
        w.add(k("attention.value_length"), u32v(s.head_dim))?;
    }
    w.add(k("rope.freq_base"), Value::F32(s.rope_freq_base))?;
    w.add(k("attention.layer_norm_rms_epsilon"), Value::F32(s.rms_eps))?;
    if let Some(window) = s.sliding_window {
        w.add(k("attention.sliding_window"), u32v(window))?;
    }
    if s.arch == Architecture::Llama {
        w.add(k("vocab_size"), u32v(s.vocab))?;
    }
    if matches!(s.arch, Architecture::Llama | Architecture::Phi3) {
        w.add(k("rope.dimension_count"), u32v(s.head_dim))?;
    }
    if let Some((original, attn_factor)) = s.long_rope {
        w.add(k("rope.scaling.original_context_length"), u32v(original))?;
        w.add(k("rope.scaling.attn_factor"), Value::F32(attn_factor))?;
    }
    if let Some((attn, last)) = s.softcaps {
        w.add(k("attn_logit_softcapping"), Value::F32(attn))?;
        w.add(k("final_logit_softcapping"), Value::F32(last))?;
    }
    if s.n_expert > 0 {
        w.add(k("expert_count"), u32v(s.n_expert))?;
        w.add(k("expert_used_count"), u32v(s.n_expert_used))?;
        w.add(k("expert_feed_forward_length"), u32v(s.n_ff_expert))?;
    }
    add_tokenizer(&mut w, &s, seed)?;
    plan_tensors(&mut w, &s)?;
    Ok(w)
}

fn plan_tensors(w: &mut GgufWriter, s: &Spec) -> Result<(), GgufError> {
    let (e, v) = (s.n_embd as u64, s.vocab as u64);
    let q_dim = (s.n_head * s.head_dim) as u64;
    let kv_dim = (s.n_head_kv * s.head_dim) as u64;
    let hd = s.head_dim as u64;
    let f32t = GgmlType::F32;
    let embd_type = if s.tied_embeddings {
        GgmlType::Q6K
    } else {
        GgmlType::Q4K
    };
    w.add_tensor_planned("token_embd.weight", &[e, v], fit_row(embd_type, s.n_embd))?;
    w.add_tensor_planned("output_norm.weight", &[e], f32t)?;
    if !s.tied_embeddings {
        w.add_tensor_planned("output.weight", &[e, v], fit_row(GgmlType::Q6K, s.n_embd))?;
    }
    if s.llama3_rope_factors {
        w.add_tensor_planned("rope_freqs.weight", &[hd / 2], f32t)?;
    }
    if s.long_rope.is_some() {
        w.add_tensor_planned("rope_factors_long.weight", &[hd / 2], f32t)?;
        w.add_tensor_planned("rope_factors_short.weight", &[hd / 2], f32t)?;
    }
    for i in 0..s.n_layers {
        let more = use_more_bits(i, s.n_layers);
        let b = |name: &str| format!("blk.{i}.{name}");
        let q4 = |row: usize| fit_row(GgmlType::Q4K, row);
        let q4_or_q6 = |row: usize| fit_row(if more { GgmlType::Q6K } else { GgmlType::Q4K }, row);
        w.add_tensor_planned(b("attn_norm.weight"), &[e], f32t)?;
        if s.fused_projections {
            w.add_tensor_planned(b("attn_qkv.weight"), &[e, q_dim + 2 * kv_dim], q4(s.n_embd))?;
        } else {
            w.add_tensor_planned(b("attn_q.weight"), &[e, q_dim], q4(s.n_embd))?;
            w.add_tensor_planned(b("attn_k.weight"), &[e, kv_dim], q4(s.n_embd))?;
            w.add_tensor_planned(b("attn_v.weight"), &[e, kv_dim], q4_or_q6(s.n_embd))?;
        }
        if s.attn_bias {
            w.add_tensor_planned(b("attn_q.bias"), &[q_dim], f32t)?;
            w.add_tensor_planned(b("attn_k.bias"), &[kv_dim], f32t)?;
            w.add_tensor_planned(b("attn_v.bias"), &[kv_dim], f32t)?;
        }
        w.add_tensor_planned(b("attn_output.weight"), &[q_dim, e], q4(q_dim as usize))?;
        if matches!(
            s.arch,
            Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Gemma3
        ) {
            w.add_tensor_planned(b("attn_q_norm.weight"), &[hd], f32t)?;
            w.add_tensor_planned(b("attn_k_norm.weight"), &[hd], f32t)?;
        }
        if s.arch.is_gemma() {
            w.add_tensor_planned(b("post_attention_norm.weight"), &[e], f32t)?;
            w.add_tensor_planned(b("post_ffw_norm.weight"), &[e], f32t)?;
        }
        w.add_tensor_planned(b("ffn_norm.weight"), &[e], f32t)?;
        if s.n_expert > 0 {
            let (x, fe) = (s.n_expert as u64, s.n_ff_expert as u64);
            w.add_tensor_planned(b("ffn_gate_inp.weight"), &[e, x], f32t)?;
            w.add_tensor_planned(b("ffn_gate_exps.weight"), &[e, fe, x], q4(s.n_embd))?;
            w.add_tensor_planned(b("ffn_up_exps.weight"), &[e, fe, x], q4(s.n_embd))?;
            w.add_tensor_planned(
                b("ffn_down_exps.weight"),
                &[fe, e, x],
                q4_or_q6(s.n_ff_expert),
            )?;
        } else {
            let f = s.n_ff as u64;
            if s.fused_projections {
                w.add_tensor_planned(b("ffn_up.weight"), &[e, 2 * f], q4(s.n_embd))?;
            } else {
                w.add_tensor_planned(b("ffn_gate.weight"), &[e, f], q4(s.n_embd))?;
                w.add_tensor_planned(b("ffn_up.weight"), &[e, f], q4(s.n_embd))?;
            }
            w.add_tensor_planned(b("ffn_down.weight"), &[f, e], q4_or_q6(s.n_ff))?;
        }
    }
    Ok(())
}

/// Llama 3.1's RoPE frequency factors (factor 8, low/high frequency factors 1 and 4, original
/// context 8192), computed the way the Hugging Face converter does.
fn llama3_rope_factors(head_dim: usize, base: f32) -> Vec<f32> {
    let (factor, low, high, original) = (8.0f64, 1.0f64, 4.0f64, 8192.0f64);
    let (low_wavelen, high_wavelen) = (original / low, original / high);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / f64::from(base).powf(2.0 * i as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}

/// LongRoPE factors: growing from the fast-turning pairs to the slow ones, the long set
/// further and from a higher start. Made up (the real ones are searched per model), but
/// different from the first pair on, so a test of a few dozen positions sees which set a
/// context used.
fn long_rope_factors(head_dim: usize, long: bool) -> Vec<f32> {
    let half = head_dim / 2;
    let (first, last) = if long { (1.5, 8.0) } else { (1.0, 2.0) };
    (0..half)
        .map(|i| {
            let t = i as f64 / (half - 1).max(1) as f64;
            (first + (last - first) * t) as f32
        })
        .collect()
}

fn fill_for(name: &str, s: &Spec) -> Fill {
    if name == "rope_freqs.weight" {
        Fill::Values(llama3_rope_factors(s.head_dim, s.rope_freq_base))
    } else if let Some(long) = name.strip_prefix("rope_factors_") {
        Fill::Values(long_rope_factors(s.head_dim, long == "long.weight"))
    } else if name.ends_with("norm.weight") {
        Fill::Norm
    } else if name.ends_with(".bias") {
        Fill::Bias
    } else {
        Fill::Random
    }
}

/// Writes `preset` to `path` with weights from `seed`.
pub fn write_preset(preset: Preset, path: &Path, seed: u64) -> Result<(), GgufError> {
    write_preset_with_progress(preset, path, seed, |_, _| {})
}

/// Like [`write_preset`], calling `progress(bytes_written, total_bytes)` after each tensor.
pub fn write_preset_with_progress(
    preset: Preset,
    path: &Path,
    seed: u64,
    mut progress: impl FnMut(u64, u64),
) -> Result<(), GgufError> {
    let spec = preset.spec();
    let writer = plan(preset, seed)?;
    let total = writer.file_size();
    let mut done = 0u64;
    writer.write_streaming(path, |t, sink| {
        fill_tensor(t, &spec, seed, sink, path)?;
        done += t.n_bytes;
        progress(done, total);
        Ok(())
    })
}

/// `preset`'s GGUF image with weights from `seed`, made in memory: the bytes
/// [`write_preset`] would write (for the tiny presets; a large one needs as much memory as
/// its file).
pub fn preset_bytes(preset: Preset, seed: u64) -> Result<Vec<u8>, GgufError> {
    preset_bytes_with(preset, seed, |_| Ok(()))
}

/// [`preset_bytes`] with whatever `extra` adds to the plan (metadata, or tensors with their
/// data) before it is written: a variant of a preset for one test.
pub fn preset_bytes_with(
    preset: Preset,
    seed: u64,
    extra: impl FnOnce(&mut GgufWriter) -> Result<(), GgufError>,
) -> Result<Vec<u8>, GgufError> {
    let spec = preset.spec();
    let mut writer = plan(preset, seed)?;
    extra(&mut writer)?;
    writer.to_bytes_streaming(|t, sink| fill_tensor(t, &spec, seed, sink, Path::new("<memory>")))
}

/// The synthetic data of tensor `t` of `spec` into `sink`; `label` names the destination in
/// errors.
fn fill_tensor(
    t: &PlannedTensor,
    spec: &Spec,
    seed: u64,
    sink: &mut dyn Write,
    label: &Path,
) -> Result<(), GgufError> {
    let io = |e| GgufError::io("write", label, e);
    let mut rng = tensor_rng(seed, &t.name);
    match fill_for(&t.name, spec) {
        Fill::Values(values) => {
            for v in values {
                sink.write_all(&v.to_le_bytes()).map_err(io)?;
            }
        }
        Fill::Norm => {
            for _ in 0..t.n_bytes / 4 {
                let v: f32 = 1.0 + rng.random_range(-0.1f32..0.1);
                sink.write_all(&v.to_le_bytes()).map_err(io)?;
            }
        }
        Fill::Bias => {
            for _ in 0..t.n_bytes / 4 {
                let v: f32 = rng.random_range(-0.5f32..0.5);
                sink.write_all(&v.to_le_bytes()).map_err(io)?;
            }
        }
        Fill::Random => random_weights(t, &mut rng, sink).map_err(io)?,
    }
    Ok(())
}

/// Each tensor has its own stream, so its content depends only on the seed and its name.
fn tensor_rng(seed: u64, name: &str) -> StdRng {
    // FNV-1a of the name, mixed with the seed.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    StdRng::seed_from_u64(h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Positions and ranges of the fp16 scale fields in one block, chosen so that weights stay
/// roughly within ±0.1 and every product of the dequantization below 1 in magnitude (the GPU
/// dequantization test's rounding argument needs it): random bytes elsewhere give arbitrary
/// quant codes and sub-scales.
fn scale_fields(ty: GgmlType) -> &'static [(usize, f32, f32)] {
    match ty {
        GgmlType::Iq4Xs => &[(0, 2e-5, 4e-5)],
        GgmlType::Q4K | GgmlType::Q5K => &[(0, 1e-4, 2e-4), (2, 1e-4, 2e-4)],
        GgmlType::Q6K => &[(208, 6.2e-5, 1e-4)],
        GgmlType::Q2K => &[(80, 1e-3, 2e-3), (82, 1e-3, 2e-3)],
        GgmlType::Q3K => &[(108, 1e-4, 2e-4)],
        GgmlType::Q8_0 => &[(0, 2e-4, 4e-4)],
        GgmlType::Q5_0 => &[(0, 2e-3, 4e-3)],
        GgmlType::Q4_0 => &[(0, 4e-3, 8e-3)],
        GgmlType::Iq4Nl => &[(0, 4e-4, 7e-4)],
        GgmlType::Q4_1 | GgmlType::Q5_1 => &[(0, 2e-3, 4e-3), (2, -0.03, -0.02)],
        _ => &[],
    }
}

/// Fills `bytes`, whole blocks of the quantized type `ty`, with random valid blocks: random
/// bytes, then each block's f16 scale fields set to small finite values. Every other bit
/// pattern of these formats is a valid weight, so every quant code and sub-scale path is
/// exercised, and the weights stay small enough for products and activations to stay finite.
/// Synthetic models and the kernel tests share it.
///
/// # Panics
/// When `bytes` is not whole blocks of `ty`.
pub fn fill_random_blocks<R: Rng + ?Sized>(ty: GgmlType, bytes: &mut [u8], rng: &mut R) {
    let block = ty.type_size();
    assert!(
        bytes.len().is_multiple_of(block),
        "{} bytes are not whole {ty} blocks of {block}",
        bytes.len()
    );
    rng.fill_bytes(bytes);
    for b in bytes.chunks_exact_mut(block) {
        for &(at, lo, hi) in scale_fields(ty) {
            let scale = f16::from_f32(rng.random_range(lo..hi));
            b[at..at + 2].copy_from_slice(&scale.to_bits().to_le_bytes());
        }
    }
}

/// [`fill_random_blocks`] from a generator seeded with `seed`, for callers without one.
pub fn fill_random_blocks_seeded(ty: GgmlType, bytes: &mut [u8], seed: u64) {
    fill_random_blocks(ty, bytes, &mut StdRng::seed_from_u64(seed));
}

fn random_weights(
    t: &PlannedTensor,
    rng: &mut StdRng,
    sink: &mut dyn Write,
) -> std::io::Result<()> {
    let ty = t.ggml_type;
    if ty == GgmlType::F32 {
        for _ in 0..t.n_bytes / 4 {
            let v: f32 = rng.random_range(-0.05f32..0.05);
            sink.write_all(&v.to_le_bytes())?;
        }
        return Ok(());
    }
    let block = ty.type_size();
    let blocks_per_chunk = (1 << 20) / block;
    let mut left = t.n_bytes / block as u64;
    let mut buf = vec![0u8; blocks_per_chunk * block];
    while left > 0 {
        let n = (left as usize).min(blocks_per_chunk);
        let chunk = &mut buf[..n * block];
        fill_random_blocks(ty, chunk, rng);
        sink.write_all(chunk)?;
        left -= n as u64;
    }
    Ok(())
}

/// GPT-2's reversible byte-to-character map used by byte-level BPE vocabularies.
pub fn gpt2_byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            u32::from(b)
        } else {
            let c = next;
            next += 1;
            c
        };
        out[b as usize] = char::from_u32(code).unwrap_or('?');
    }
    out
}

/// Token types of the GGUF tokenizer metadata (llama.cpp's `llama_token_type`).
const TOKEN_NORMAL: i32 = 1;
const TOKEN_UNKNOWN: i32 = 2;
const TOKEN_CONTROL: i32 = 3;
const TOKEN_BYTE: i32 = 6;

fn add_tokenizer(w: &mut GgufWriter, s: &Spec, seed: u64) -> Result<(), GgufError> {
    let mut rng = tensor_rng(seed, "tokenizer");
    if s.arch.is_gemma() {
        return add_sentencepiece_tokenizer(w, s, &mut rng);
    }
    let specials: &[&str] = match s.arch {
        Architecture::Llama => &[
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ],
        _ => &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    };
    let n_normal = s.vocab - specials.len();
    let bytes = gpt2_byte_chars();
    let mut tokens: Vec<String> = bytes.iter().map(|c| c.to_string()).collect();
    let mut seen: HashSet<String> = tokens.iter().cloned().collect();
    let mut merges = Vec::new();
    // Letters and the space marker first, so merged tokens look like word pieces.
    let common: Vec<usize> = tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| t.chars().all(|c| c.is_ascii_lowercase() || c == 'Ġ'))
        .map(|(i, _)| i)
        .collect();
    while tokens.len() < n_normal {
        let pick = |rng: &mut StdRng, tokens: &Vec<String>| {
            if rng.random_bool(0.5) {
                common[rng.random_range(0..common.len())]
            } else {
                rng.random_range(0..tokens.len())
            }
        };
        let (a, b) = (pick(&mut rng, &tokens), pick(&mut rng, &tokens));
        let merged = format!("{}{}", tokens[a], tokens[b]);
        if merged.chars().count() > 12 || !seen.insert(merged.clone()) {
            continue;
        }
        merges.push(format!("{} {}", tokens[a], tokens[b]));
        tokens.push(merged);
    }
    let mut types = vec![TOKEN_NORMAL; tokens.len()];
    let first_special = tokens.len();
    tokens.extend(specials.iter().map(|t| t.to_string()));
    types.extend(std::iter::repeat_n(TOKEN_CONTROL, specials.len()));
    let (bos, eos, pre) = match s.arch {
        Architecture::Llama => (first_special, first_special + 4, "llama-bpe"),
        _ => (first_special, first_special + 2, "qwen2"),
    };
    w.add("tokenizer.ggml.model", "gpt2")?;
    w.add("tokenizer.ggml.pre", pre)?;
    w.add("tokenizer.ggml.tokens", Value::strings(tokens))?;
    w.add("tokenizer.ggml.token_type", Value::i32s(types))?;
    w.add("tokenizer.ggml.merges", Value::strings(merges))?;
    w.add("tokenizer.ggml.bos_token_id", Value::U32(bos as u32))?;
    w.add("tokenizer.ggml.eos_token_id", Value::U32(eos as u32))?;
    w.add(
        "tokenizer.ggml.padding_token_id",
        Value::U32(first_special as u32),
    )?;
    w.add(
        "tokenizer.ggml.add_bos_token",
        Value::Bool(s.arch == Architecture::Llama),
    )?;
    Ok(())
}

fn add_sentencepiece_tokenizer(
    w: &mut GgufWriter,
    s: &Spec,
    rng: &mut StdRng,
) -> Result<(), GgufError> {
    let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"]
        .map(String::from)
        .to_vec();
    let mut types = vec![TOKEN_CONTROL, TOKEN_CONTROL, TOKEN_CONTROL, TOKEN_UNKNOWN];
    let mut scores = vec![0.0f32; 4];
    let controls = ["<start_of_turn>", "<end_of_turn>"];
    for c in controls {
        tokens.push(c.into());
        types.push(TOKEN_CONTROL);
        scores.push(0.0);
    }
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(TOKEN_BYTE);
        scores.push(0.0);
    }
    let alphabet: Vec<String> =
        "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-:;()"
            .chars()
            .map(String::from)
            .collect();
    let mut pieces: Vec<String> = alphabet.clone();
    let mut seen: HashSet<String> = pieces.iter().cloned().collect();
    let n_pieces = s.vocab - tokens.len();
    while pieces.len() < n_pieces {
        let a = &pieces[rng.random_range(0..pieces.len())];
        let b = &alphabet[rng.random_range(1..alphabet.len())];
        let merged = format!("{a}{b}");
        if merged.chars().count() > 12 || !seen.insert(merged.clone()) {
            continue;
        }
        pieces.push(merged);
    }
    for (i, p) in pieces.into_iter().enumerate() {
        tokens.push(p);
        types.push(TOKEN_NORMAL);
        scores.push(-(i as f32));
    }
    w.add("tokenizer.ggml.model", "llama")?;
    w.add("tokenizer.ggml.pre", "default")?;
    w.add("tokenizer.ggml.tokens", Value::strings(tokens))?;
    w.add(
        "tokenizer.ggml.scores",
        Value::Array {
            elem: ValueType::F32,
            items: scores.into_iter().map(Value::F32).collect(),
        },
    )?;
    w.add("tokenizer.ggml.token_type", Value::i32s(types))?;
    w.add("tokenizer.ggml.bos_token_id", Value::U32(2))?;
    w.add("tokenizer.ggml.eos_token_id", Value::U32(1))?;
    w.add("tokenizer.ggml.unknown_token_id", Value::U32(3))?;
    w.add("tokenizer.ggml.padding_token_id", Value::U32(0))?;
    w.add("tokenizer.ggml.add_bos_token", Value::Bool(true))?;
    w.add("tokenizer.ggml.add_eos_token", Value::Bool(false))?;
    w.add("tokenizer.ggml.add_space_prefix", Value::Bool(false))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layers of the real Gemma 3 270M Q4_K_M file whose attn_v/ffn_down got more bits
    /// (read from the file with gguf-py: Q8_0/Q6_K instead of Q5_0/Q4_K).
    #[test]
    fn more_bits_layers_match_the_real_q4_k_m_file() {
        let more: Vec<usize> = (0..18).filter(|&i| use_more_bits(i, 18)).collect();
        assert_eq!(more, [0, 1, 4, 7, 10, 13, 15, 16, 17]);
    }

    #[test]
    fn rows_that_are_not_a_multiple_of_256_fall_back_like_llama_cpp() {
        assert_eq!(fit_row(GgmlType::Q4K, 640), GgmlType::Q5_0);
        assert_eq!(fit_row(GgmlType::Q6K, 640), GgmlType::Q8_0);
        assert_eq!(fit_row(GgmlType::Q4K, 1024), GgmlType::Q4K);
    }

    #[test]
    fn gpt2_byte_map_is_a_bijection_with_space_as_g_dot() {
        let chars = gpt2_byte_chars();
        let unique: HashSet<char> = chars.iter().copied().collect();
        assert_eq!(unique.len(), 256);
        assert_eq!(chars[b' ' as usize], 'Ġ');
        assert_eq!(chars[b'a' as usize], 'a');
    }
}
