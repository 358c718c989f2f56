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
    Gemma3,
}

impl Architecture {
    pub fn from_name(name: &str) -> Result<Architecture, GgufError> {
        Ok(match name {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            "qwen3moe" => Architecture::Qwen3Moe,
            "gemma3" => Architecture::Gemma3,
            other => {
                return Err(GgufError::UnsupportedArchitecture {
                    name: other.to_owned(),
                })
            }
        })
    }

    /// The prefix of this architecture's metadata keys (`general.architecture`'s value).
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Qwen3Moe => "qwen3moe",
            Architecture::Gemma3 => "gemma3",
        }
    }
}

/// Gemma 3 alternates five sliding-window layers with one global layer. llama.cpp fixes this
/// for the architecture; files may also state it in `gemma3.attention.sliding_window_pattern`.
pub const GEMMA3_SLIDING_WINDOW_PATTERN: usize = 6;
/// Gemma 3's sliding-window layers use RoPE base 10 000 (its global layers use `rope.freq_base`).
/// Fixed by the architecture; a file may override it with `gemma3.rope.freq_base_swa`.
pub const GEMMA3_ROPE_FREQ_BASE_LOCAL: f32 = 10_000.0;

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
    pub sliding_window: Option<usize>,
    /// Every `pattern`-th layer (layer `i` with `i % pattern == pattern - 1`) is global; the
    /// others use the sliding window.
    pub sliding_window_pattern: Option<usize>,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_expert: Option<usize>,
    pub vocab_size: usize,
    pub context_length: usize,
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

        let is_gemma3 = architecture == Architecture::Gemma3;
        let sliding_window = if is_gemma3 {
            Some(k.usize("attention.sliding_window")?)
        } else {
            k.opt_usize("attention.sliding_window")?
        };
        let sliding_window_pattern = match k.opt_usize("attention.sliding_window_pattern")? {
            Some(p) => Some(p),
            None if is_gemma3 => Some(GEMMA3_SLIDING_WINDOW_PATTERN),
            None => None,
        };
        let rope_freq_base_local = match k.opt_f32("rope.freq_base_swa")? {
            Some(v) => Some(v),
            None if is_gemma3 => Some(GEMMA3_ROPE_FREQ_BASE_LOCAL),
            None => None,
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
        })
    }

    /// Whether layer `layer` attends through the sliding window (as opposed to globally).
    pub fn is_sliding_layer(&self, layer: usize) -> bool {
        match (self.sliding_window, self.sliding_window_pattern) {
            (Some(_), Some(p)) if p > 0 => layer % p != p - 1,
            (Some(_), None) => true,
            _ => false,
        }
    }

    /// The RoPE base for layer `layer`.
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
            other => {
                return Err(GgufError::InvalidValue {
                    key: type_key,
                    value: format!("{other:?}"),
                    reason: "supported scaling types are none, linear and yarn".into(),
                })
            }
        },
    };
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
