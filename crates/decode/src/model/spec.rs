//! What differs between architectures, reduced to plain numbers and switches per layer.
//!
//! All four families share one Llama-like skeleton (pre-norm attention and FFN blocks with
//! residuals). The differences: RoPE layout (Llama rotates interleaved pairs, the others
//! NeoX halves), Q/K RMSNorm (Qwen3, Gemma 3), Gemma's embedding scale, GELU gate, sandwich
//! norms and alternating sliding-window/global layers with their own RoPE bases, and Qwen3-MoE's
//! routed experts.

use super::consistency::{self, AttentionWidths};
use crate::backend::{GateActivation, Rope};
use crate::error::{DecodeError, Result};
use gguf_loader::{Architecture, GgufFile, ModelConfig, RopeScaling};

/// Per-layer attention settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerSpec {
    pub rope: Rope,
    pub window: Option<usize>,
}

/// Everything the graph needs to know about a model besides its weights.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    pub arch_name: String,
    pub architecture: Architecture,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Row widths of the attention projections (head counts times head sizes, checked).
    pub widths: AttentionWidths,
    pub eps: f32,
    pub vocab: usize,
    pub context_length: usize,
    pub embed_scale: f32,
    pub attn_scale: f32,
    /// Soft-capping of the scaled attention scores (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Soft-capping of the output logits (Gemma 2).
    pub final_softcap: Option<f32>,
    pub gate: GateActivation,
    pub qk_norm: bool,
    pub sandwich_norms: bool,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_expert: usize,
    pub layers: Vec<LayerSpec>,
    /// Phi-3's LongRoPE: which of its two sets of frequency factors a context uses.
    pub long_rope: Option<LongRope>,
}

/// Phi-3's LongRoPE, as llama.cpp applies it: a context of more than `original_context`
/// positions per sequence turns by `rope_factors_long.weight`, a shorter one by
/// `rope_factors_short.weight`, and `attn_factor` scales every rotated query and key (here
/// folded into [`ModelSpec::attn_scale`], as its square).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LongRope {
    pub original_context: usize,
    pub attn_factor: f32,
}

impl LongRope {
    /// Whether a context of `positions` per sequence turns by the long factors rather than
    /// the short ones: only beyond the original context, as llama.cpp decides by `n_ctx_seq`.
    pub fn is_long(&self, positions: usize) -> bool {
        positions > self.original_context
    }
}

impl ModelSpec {
    pub fn from_gguf(file: &GgufFile) -> Result<ModelSpec> {
        // A tensor the loader indexed but cannot read fails the model here, by name: looking
        // tensors up one by one would read an unreadable `output.weight` as absent (tied).
        if let Some(u) = file.unreadable_tensors().first() {
            return Err(DecodeError::Gguf(u.error()));
        }
        let arch_name = file.get_str("general.architecture")?.to_string();
        let c = ModelConfig::from_gguf(file).map_err(|e| {
            match gguf_loader::model::Architecture::from_name(&arch_name) {
                Ok(_) => DecodeError::Gguf(e),
                Err(_) => DecodeError::UnsupportedArchitecture {
                    name: arch_name.clone(),
                    supported: gguf_loader::model::Architecture::names(),
                },
            }
        })?;
        let key = |k: &str| format!("{arch_name}.{k}");
        // Before anything is sized by a count from the metadata.
        let widths = consistency::check(file, &arch_name, &c)?;
        let gemma = c.architecture.is_gemma();
        let gemma3 = c.architecture == Architecture::Gemma3;
        let n_rot = match file.get(&key("rope.dimension_count")) {
            Some(_) => file.get_u32(&key("rope.dimension_count"))? as usize,
            None => c.head_dim_k,
        };
        if n_rot % 2 != 0 || n_rot > c.head_dim_k {
            return Err(DecodeError::InvalidArgument(format!(
                "{} = {n_rot} must be even and at most the head size {}",
                key("rope.dimension_count"),
                c.head_dim_k
            )));
        }
        let (position_scale, long_rope) = match &c.rope_scaling {
            None | Some(RopeScaling::FreqFactors { .. }) => (1.0, None),
            Some(RopeScaling::Linear { factor }) => (*factor, None),
            Some(RopeScaling::Yarn { .. }) => {
                return Err(DecodeError::InvalidArgument(format!(
                    "{} = yarn is not supported yet (none, linear, frequency factors and \
                     Phi-3's LongRoPE are)",
                    key("rope.scaling.type")
                )))
            }
            Some(RopeScaling::LongRope {
                original_context_length,
                attn_factor,
            }) => {
                // The factor scales the rotated part of every query and key, so their product
                // by its square: that is the attention scale's only where every dimension
                // turns.
                if n_rot != c.head_dim_k && *attn_factor != 1.0 {
                    return Err(DecodeError::InvalidArgument(format!(
                        "LongRoPE with {} = {attn_factor} over {n_rot} of {} head dimensions is \
                         not supported: the factor scales only the rotated dimensions, and \
                         hipdecode applies it as an attention scale (all dimensions rotated)",
                        key("rope.scaling.attn_factor"),
                        c.head_dim_k
                    )));
                }
                if !attn_factor.is_finite() || *attn_factor <= 0.0 {
                    return Err(DecodeError::InvalidArgument(format!(
                        "{} = {attn_factor} must be a positive number",
                        key("rope.scaling.attn_factor")
                    )));
                }
                let long = LongRope {
                    original_context: *original_context_length,
                    attn_factor: *attn_factor,
                };
                (1.0, Some(long))
            }
        };
        // Which layers slide, their window and every layer's RoPE base are ModelConfig's to
        // decide (one rule for every architecture); the spec only copies its answers.
        let layers = (0..c.n_layers)
            .map(|il| LayerSpec {
                rope: Rope {
                    neox: c.architecture != Architecture::Llama,
                    freq_base: c.rope_base_for_layer(il),
                    // Gemma 3 scales positions on its global layers only.
                    position_scale: if gemma3 && c.is_sliding_layer(il) {
                        1.0
                    } else {
                        position_scale
                    },
                    n_rot,
                },
                window: c.window_for_layer(il),
            })
            .collect();
        Ok(ModelSpec {
            arch_name,
            architecture: c.architecture,
            n_layers: c.n_layers,
            n_embd: c.n_embd,
            n_ff: c.n_ff,
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim_k: c.head_dim_k,
            head_dim_v: c.head_dim_v,
            widths,
            eps: c.rms_eps,
            vocab: c.vocab_size,
            context_length: c.context_length,
            embed_scale: if gemma { (c.n_embd as f32).sqrt() } else { 1.0 },
            attn_scale: long_rope.map_or(1.0, |l| l.attn_factor * l.attn_factor)
                / (query_pre_attn_scalar(&c) as f32).sqrt(),
            attn_softcap: c.attn_logit_softcap,
            final_softcap: c.final_logit_softcap,
            gate: if gemma {
                GateActivation::GeluTanh
            } else {
                GateActivation::Silu
            },
            qk_norm: matches!(
                c.architecture,
                Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Gemma3
            ),
            sandwich_norms: gemma,
            n_expert: c.n_expert,
            n_expert_used: c.n_expert_used,
            n_ff_expert: c.n_ff_expert.unwrap_or(c.n_ff),
            layers,
            long_rope,
        })
    }

    pub fn is_moe(&self) -> bool {
        self.n_expert > 0
    }
}

/// Gemma 3 27B is the one Gemma 3 size whose `query_pre_attn_scalar` is not the head size: it is
/// `n_embd / n_head` (5376 / 32 = 168, against heads of 128).
///
/// GGUF has no key for it, so the 27B model is recognised by its depth: 62 layers, which no
/// other Gemma 3 size has (270M: 18, 1B: 26, 4B: 34, 12B: 48). llama.cpp decides it the same way.
pub const GEMMA3_27B_LAYERS: usize = 62;
/// Gemma 2 27B likewise scales by `n_embd / n_head` (4608 / 32 = 144, against heads of 128),
/// and is recognised by its 46 layers (2B: 26, 9B: 42), as llama.cpp does.
pub const GEMMA2_27B_LAYERS: usize = 46;

/// The number whose inverse square root scales attention scores.
pub fn query_pre_attn_scalar(c: &ModelConfig) -> usize {
    let is_27b = match c.architecture {
        Architecture::Gemma3 => c.n_layers == GEMMA3_27B_LAYERS,
        Architecture::Gemma2 => c.n_layers == GEMMA2_27B_LAYERS,
        _ => false,
    };
    if is_27b {
        // n_head >= 1: ModelConfig refuses a zero count.
        c.n_embd / c.n_head
    } else {
        c.head_dim_k
    }
}

#[cfg(test)]
mod unreadable_tests {
    use super::*;
    use gguf_loader::synth::{write_preset, Preset};

    /// A model file with one tensor of a type the loader cannot read still opens (so `inspect`
    /// shows it), and making a model of it is an error that names the tensor and the type.
    #[test]
    fn a_tensor_of_an_unreadable_type_fails_the_model_by_name() {
        let path = test_support::models::scratch_dir("spec")
            .join(format!("unreadable-{}.gguf", std::process::id()));
        write_preset(Preset::TinyLlama, &path, 5).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert!(ModelSpec::from_gguf(&GgufFile::from_bytes(bytes.clone()).unwrap()).is_ok());
        test_support::models::set_tensor_type(&mut bytes, "output.weight", 16);
        let file = GgufFile::from_bytes(bytes).expect("it still opens");
        assert_eq!(file.unreadable_tensors()[0].name, "output.weight");
        let e = ModelSpec::from_gguf(&file).unwrap_err().to_string();
        assert!(e.contains("IQ2_XXS") && e.contains("output.weight"), "{e}");
    }
}
