//! The model description read from GGUF metadata: architecture and hyperparameters.
//!
//! Every value comes from a key in the file. A key the architecture needs and the file lacks
//! is an error naming the key. The few values below that are not keys are fixed by the
//! architecture itself (llama.cpp hard-codes them the same way), never guessed per file.

use crate::{GgufError, GgufFile};
use serde::Serialize;

/// Model families this crate describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Llama,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Gemma2,
    Gemma3,
    /// Phi-3 and Phi-3.5 (and Phi-4 mini): Q, K and V in one `attn_qkv` tensor and the gate
    /// and up projections in one `ffn_up`, which the file index shows as the separate tensors
    /// ([`crate::fused`]); otherwise Llama with NeoX RoPE.
    Phi3,
}

impl Architecture {
    /// Every architecture, the one list the messages and checks read.
    pub const ALL: [Architecture; 7] = [
        Architecture::Llama,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Qwen3Moe,
        Architecture::Gemma2,
        Architecture::Gemma3,
        Architecture::Phi3,
    ];

    /// The names of [`Architecture::ALL`], for messages: "llama, qwen2, ...".
    pub fn names() -> String {
        Self::ALL.map(Architecture::name).join(", ")
    }

    pub fn from_name(name: &str) -> Result<Architecture, GgufError> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| GgufError::UnsupportedArchitecture {
                name: name.to_owned(),
                supported: Self::names(),
            })
    }

    /// Whether the architecture has sliding-window attention layers. Of the families here only
    /// Gemma 2 and 3 do: llama.cpp builds llama, qwen2, qwen3 and qwen3moe with full attention
    /// on every layer and never reads their `attention.sliding_window`, so a file of those
    /// architectures that carries the key (copied from a training config, say) still attends
    /// globally everywhere, in llama.cpp, in the Python reference and here.
    pub fn has_sliding_window_layers(self) -> bool {
        self.is_gemma()
    }

    /// Gemma 2 or 3: embeddings scaled by sqrt(n_embd), GELU feed-forward, norms after the
    /// attention and feed-forward blocks as well as before.
    pub fn is_gemma(self) -> bool {
        matches!(self, Architecture::Gemma2 | Architecture::Gemma3)
    }

    /// The prefix of this architecture's metadata keys (`general.architecture`'s value).
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Qwen3Moe => "qwen3moe",
            Architecture::Gemma2 => "gemma2",
            Architecture::Gemma3 => "gemma3",
            Architecture::Phi3 => "phi3",
        }
    }
}

/// Gemma 3 alternates five sliding-window layers with one global layer. llama.cpp fixes this
/// for the architecture; files may also state it in `gemma3.attention.sliding_window_pattern`.
pub const GEMMA3_SLIDING_WINDOW_PATTERN: usize = 6;
/// Gemma 3's sliding-window layers use RoPE base 10 000 (its global layers use `rope.freq_base`).
/// Fixed by the architecture; a file may override it with `gemma3.rope.freq_base_swa`.
pub const GEMMA3_ROPE_FREQ_BASE_LOCAL: f32 = 10_000.0;

/// Gemma 2 alternates sliding-window and global layers (layers 0, 2, 4, ... slide), with a
/// window of 4096 unless `gemma2.attention.sliding_window` says otherwise; llama.cpp fixes both
/// for the architecture and lets the keys override them.
pub const GEMMA2_SLIDING_WINDOW_PATTERN: usize = 2;
pub const GEMMA2_SLIDING_WINDOW: usize = 4096;
/// Gemma 2's soft-caps when the file does not state them (`attn_logit_softcapping`,
/// `final_logit_softcapping`): the values of every released Gemma 2, and llama.cpp's defaults.
pub const GEMMA2_ATTN_LOGIT_SOFTCAP: f32 = 50.0;
pub const GEMMA2_FINAL_LOGIT_SOFTCAP: f32 = 30.0;

/// How positions are rescaled for long contexts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum RopeScaling {
    /// Positions divided by `factor` (`rope.scaling.type = linear`).
    Linear { factor: f32 },
    /// YaRN (`rope.scaling.type = yarn`).
    Yarn {
        factor: f32,
        original_context_length: usize,
    },
    /// Per-dimension frequency factors stored as a tensor (Llama 3.1's `rope_freqs.weight`).
    FreqFactors { tensor: String },
    /// Phi-3's LongRoPE: one set of frequency factors for contexts up to
    /// `original_context_length` (`rope_factors_short.weight`), another beyond it
    /// (`rope_factors_long.weight`), and the rotated dimensions scaled by `attn_factor`.
    LongRope {
        original_context_length: usize,
        attn_factor: f32,
    },
}

/// Architecture and hyperparameters of a model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// RoPE base of full-attention layers.
    pub rope_freq_base: f32,
    /// RoPE base of sliding-window layers, where it differs (Gemma 3).
    pub rope_freq_base_local: Option<f32>,
    pub rope_scaling: Option<RopeScaling>,
    pub rms_eps: f32,
    /// The window of the sliding-window layers; `None` for architectures without them (see
    /// [`Architecture::has_sliding_window_layers`]), whatever keys the file holds.
    pub sliding_window: Option<usize>,
    /// Every `pattern`-th layer (layer `i` with `i % pattern == pattern - 1`) is global; the
    /// others use the sliding window. [`ModelConfig::is_sliding_layer`] is the one reading of it.
    pub sliding_window_pattern: Option<usize>,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_expert: Option<usize>,
    pub vocab_size: usize,
    pub context_length: usize,
    /// Soft-capping of the scaled attention scores, `cap * tanh(s / cap)` (Gemma 2).
    pub attn_logit_softcap: Option<f32>,
    /// Soft-capping of the output logits (Gemma 2).
    pub final_logit_softcap: Option<f32>,
}

/// Reads architecture-prefixed keys, converting and naming the key in every error.
struct Keys<'f> {
    file: &'f GgufFile,
    arch: &'static str,
}

impl Keys<'_> {
    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    fn usize(&self, suffix: &str) -> Result<usize, GgufError> {
        let key = self.key(suffix);
        let v = self.file.get_u64(&key)?;
        positive(&key, v)
    }

    fn opt_usize(&self, suffix: &str) -> Result<Option<usize>, GgufError> {
        if self.file.get(&self.key(suffix)).is_none() {
            return Ok(None);
        }
        self.usize(suffix).map(Some)
    }

    fn f32(&self, suffix: &str) -> Result<f32, GgufError> {
        let key = self.key(suffix);
        let v = self.file.get_f32(&key)?;
        if !v.is_finite() || v <= 0.0 {
            return Err(GgufError::InvalidValue {
                key,
                value: v.to_string(),
                reason: "must be a positive finite number".into(),
            });
        }
        Ok(v)
    }

    fn opt_f32(&self, suffix: &str) -> Result<Option<f32>, GgufError> {
        if self.file.get(&self.key(suffix)).is_none() {
            return Ok(None);
        }
        self.f32(suffix).map(Some)
    }
}

fn positive(key: &str, v: u64) -> Result<usize, GgufError> {
    match usize::try_from(v) {
        Ok(0) => Err(GgufError::InvalidValue {
            key: key.to_owned(),
            value: "0".into(),
            reason: "must be at least 1".into(),
        }),
        Ok(v) => Ok(v),
        Err(_) => Err(GgufError::OutOfRange {
            key: key.to_owned(),
            value: v.to_string(),
            target: "usize",
        }),
    }
}

impl ModelConfig {
    pub fn from_gguf(f: &GgufFile) -> Result<ModelConfig, GgufError> {
        let architecture = Architecture::from_name(f.get_str("general.architecture")?)?;
        let k = Keys {
            file: f,
            arch: architecture.name(),
        };
        let n_embd = k.usize("embedding_length")?;
        let n_head = k.usize("attention.head_count")?;
        let n_head_kv = k.usize("attention.head_count_kv")?;
        // GGUF defines key_length/value_length as optional, meaning n_embd / n_head when absent.
        let derived_head_dim = |suffix: &str| -> Result<usize, GgufError> {
            match k.opt_usize(suffix)? {
                Some(v) => Ok(v),
                None if n_embd % n_head == 0 => Ok(n_embd / n_head),
                None => Err(GgufError::MissingKey { key: k.key(suffix) }),
            }
        };
        let head_dim_k = derived_head_dim("attention.key_length")?;
        let head_dim_v = derived_head_dim("attention.value_length")?;
        if n_head % n_head_kv != 0 {
            return Err(GgufError::InvalidValue {
                key: k.key("attention.head_count_kv"),
                value: n_head_kv.to_string(),
                reason: format!("must divide the head count {n_head}"),
            });
        }

        // Sliding windows belong to the architecture (see `has_sliding_window_layers`): the
        // keys are read only where the architecture has such layers. Gemma 3 requires the
        // window, and its pattern and local RoPE base default to its fixed values; Gemma 2's
        // window and pattern have defaults, and its local layers use the global base unless
        // the file gives another.
        let (sliding_window, sliding_window_pattern, rope_freq_base_local) = match architecture {
            Architecture::Gemma3 => (
                Some(k.usize("attention.sliding_window")?),
                Some(
                    k.opt_usize("attention.sliding_window_pattern")?
                        .unwrap_or(GEMMA3_SLIDING_WINDOW_PATTERN),
                ),
                Some(
                    k.opt_f32("rope.freq_base_swa")?
                        .unwrap_or(GEMMA3_ROPE_FREQ_BASE_LOCAL),
                ),
            ),
            Architecture::Gemma2 => (
                Some(
                    k.opt_usize("attention.sliding_window")?
                        .unwrap_or(GEMMA2_SLIDING_WINDOW),
                ),
                Some(
                    k.opt_usize("attention.sliding_window_pattern")?
                        .unwrap_or(GEMMA2_SLIDING_WINDOW_PATTERN),
                ),
                k.opt_f32("rope.freq_base_swa")?,
            ),
            _ => (None, None, None),
        };
        let (attn_logit_softcap, final_logit_softcap) = if architecture == Architecture::Gemma2 {
            (
                Some(
                    k.opt_f32("attn_logit_softcapping")?
                        .unwrap_or(GEMMA2_ATTN_LOGIT_SOFTCAP),
                ),
                Some(
                    k.opt_f32("final_logit_softcapping")?
                        .unwrap_or(GEMMA2_FINAL_LOGIT_SOFTCAP),
                ),
            )
        } else {
            (None, None)
        };

        let is_moe = architecture == Architecture::Qwen3Moe;
        let (n_expert, n_expert_used, n_ff_expert) = if is_moe {
            (
                k.usize("expert_count")?,
                k.usize("expert_used_count")?,
                Some(k.usize("expert_feed_forward_length")?),
            )
        } else {
            (
                k.opt_usize("expert_count")?.unwrap_or(0),
                k.opt_usize("expert_used_count")?.unwrap_or(0),
                k.opt_usize("expert_feed_forward_length")?,
            )
        };
        if n_expert_used > n_expert {
            return Err(GgufError::InvalidValue {
                key: k.key("expert_used_count"),
                value: n_expert_used.to_string(),
                reason: format!("exceeds the expert count {n_expert}"),
            });
        }

        Ok(ModelConfig {
            architecture,
            n_layers: k.usize("block_count")?,
            n_embd,
            n_ff: k.usize("feed_forward_length")?,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            rope_freq_base: k.f32("rope.freq_base")?,
            rope_freq_base_local,
            rope_scaling: rope_scaling(f, &k)?,
            rms_eps: k.f32("attention.layer_norm_rms_epsilon")?,
            sliding_window,
            sliding_window_pattern,
            n_expert,
            n_expert_used,
            n_ff_expert,
            vocab_size: vocab_size(f, &k)?,
            context_length: k.usize("context_length")?,
            attn_logit_softcap,
            final_logit_softcap,
        })
    }

    /// Whether layer `layer` attends through the sliding window (as opposed to globally).
    ///
    /// llama.cpp's rule (`llama_hparams::set_swa_pattern`): without a window no layer slides;
    /// with a window and a pattern `p`, layer `i` is global when `i % p == p - 1` (so `p = 1`
    /// makes every layer global) and slides otherwise; with a window and a pattern of 0 or none,
    /// every layer slides. [`ModelConfig::from_gguf`] always sets a pattern with a window.
    pub fn is_sliding_layer(&self, layer: usize) -> bool {
        match (self.sliding_window, self.sliding_window_pattern) {
            (None, _) => false,
            (Some(_), Some(p)) if p > 0 => layer % p != p - 1,
            (Some(_), _) => true,
        }
    }

    /// The window layer `layer` attends through, or `None` when it attends globally.
    pub fn window_for_layer(&self, layer: usize) -> Option<usize> {
        self.sliding_window.filter(|_| self.is_sliding_layer(layer))
    }

    /// The RoPE base for layer `layer`: the local base on sliding-window layers where the model
    /// has one, the global base everywhere else.
    pub fn rope_base_for_layer(&self, layer: usize) -> f32 {
        match self.rope_freq_base_local {
            Some(local) if self.is_sliding_layer(layer) => local,
            _ => self.rope_freq_base,
        }
    }
}

fn rope_scaling(f: &GgufFile, k: &Keys<'_>) -> Result<Option<RopeScaling>, GgufError> {
    let type_key = k.key("rope.scaling.type");
    let scaling = match f.get(&type_key) {
        None => None,
        Some(_) => match f.get_str(&type_key)? {
            "none" => None,
            "linear" => Some(RopeScaling::Linear {
                factor: k.f32("rope.scaling.factor")?,
            }),
            "yarn" => Some(RopeScaling::Yarn {
                factor: k.f32("rope.scaling.factor")?,
                original_context_length: k.usize("rope.scaling.original_context_length")?,
            }),
            // Read from the factor tensors below; the type alone says too little.
            "longrope" if f.tensor("rope_factors_long.weight").is_some() => None,
            other => {
                return Err(GgufError::InvalidValue {
                    key: type_key,
                    value: format!("{other:?}"),
                    reason: "supported scaling types are none, linear, yarn, and longrope with \
                             the rope_factors_long and rope_factors_short tensors"
                        .into(),
                })
            }
        },
    };
    if scaling.is_none() && f.tensor("rope_factors_long.weight").is_some() {
        return Ok(Some(RopeScaling::LongRope {
            original_context_length: match k.opt_usize("rope.scaling.original_context_length")? {
                Some(n) => n,
                None => k.usize("context_length")?,
            },
            attn_factor: match f.get(&k.key("rope.scaling.attn_factor")) {
                Some(_) => k.f32("rope.scaling.attn_factor")?,
                None => 1.0,
            },
        }));
    }
    if scaling.is_none() && f.tensor("rope_freqs.weight").is_some() {
        return Ok(Some(RopeScaling::FreqFactors {
            tensor: "rope_freqs.weight".into(),
        }));
    }
    Ok(scaling)
}

fn vocab_size(f: &GgufFile, k: &Keys<'_>) -> Result<usize, GgufError> {
    if let Some(v) = k.opt_usize("vocab_size")? {
        return Ok(v);
    }
    match f.get("tokenizer.ggml.tokens") {
        Some(_) => {
            let n = f.get_array("tokenizer.ggml.tokens")?.len();
            positive("tokenizer.ggml.tokens", n as u64)
        }
        None => Err(GgufError::MissingKey {
            key: format!("{} (or tokenizer.ggml.tokens)", k.key("vocab_size")),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Gemma-3-like description with the given window and pattern.
    fn config(window: Option<usize>, pattern: Option<usize>) -> ModelConfig {
        ModelConfig {
            architecture: Architecture::Gemma3,
            n_layers: 18,
            n_embd: 640,
            n_ff: 2048,
            n_head: 4,
            n_head_kv: 1,
            head_dim_k: 256,
            head_dim_v: 256,
            rope_freq_base: 1_000_000.0,
            rope_freq_base_local: Some(GEMMA3_ROPE_FREQ_BASE_LOCAL),
            rope_scaling: None,
            rms_eps: 1e-6,
            sliding_window: window,
            sliding_window_pattern: pattern,
            n_expert: 0,
            n_expert_used: 0,
            n_ff_expert: None,
            vocab_size: 262_144,
            context_length: 32_768,
            attn_logit_softcap: None,
            final_logit_softcap: None,
        }
    }

    fn global_layers(c: &ModelConfig) -> Vec<usize> {
        (0..c.n_layers)
            .filter(|&i| !c.is_sliding_layer(i))
            .collect()
    }

    #[test]
    fn sliding_layers_follow_llama_cpps_pattern_rule() {
        let all: Vec<usize> = (0..18).collect();
        // Pattern 6 (Gemma 3): every sixth layer is global.
        assert_eq!(global_layers(&config(Some(512), Some(6))), [5, 11, 17]);
        assert_eq!(global_layers(&config(Some(512), Some(4))), [3, 7, 11, 15]);
        // Pattern 1: every layer is global; pattern 0 or none: every layer slides.
        assert_eq!(global_layers(&config(Some(512), Some(1))), all);
        assert_eq!(global_layers(&config(Some(512), Some(0))), [0usize; 0]);
        assert_eq!(global_layers(&config(Some(512), None)), [0usize; 0]);
        // No window: a pattern alone makes nothing slide.
        assert_eq!(global_layers(&config(None, Some(6))), all);
    }

    #[test]
    fn window_and_rope_base_follow_the_sliding_layers() {
        let c = config(Some(512), Some(6));
        for layer in 0..c.n_layers {
            let sliding = layer % 6 != 5;
            assert_eq!(c.is_sliding_layer(layer), sliding, "layer {layer}");
            assert_eq!(
                c.window_for_layer(layer),
                sliding.then_some(512),
                "layer {layer}"
            );
            let base = if sliding { 10_000.0 } else { 1_000_000.0 };
            assert_eq!(c.rope_base_for_layer(layer), base, "layer {layer}");
        }
        // Without a window, a local base is never used.
        let c = config(None, Some(6));
        assert!((0..18)
            .all(|l| c.window_for_layer(l).is_none() && c.rope_base_for_layer(l) == 1_000_000.0));
    }
}
