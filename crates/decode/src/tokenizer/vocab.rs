//! A GGUF vocabulary's fields, as both tokenizers read them.

use crate::error::{DecodeError, Result};

/// GGUF token types (SentencePiece numbering).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// The vocabulary fields of a GGUF file.
#[derive(Clone, Debug, Default)]
pub struct Vocabulary {
    /// `tokenizer.ggml.model`: "llama" or "gpt2".
    pub model: String,
    /// `tokenizer.ggml.pre`, for gpt2 vocabularies.
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// Merge priorities of a `llama` vocabulary (empty means all zero).
    pub scores: Vec<f32>,
    /// Token types (empty means all normal).
    pub types: Vec<i32>,
    /// `"left right"` merges of a `gpt2` vocabulary, by rank.
    pub merges: Vec<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`: end of turn.
    pub eot: Option<u32>,
    /// `tokenizer.ggml.eom_token_id`: end of message (Llama 3.1 tool calls).
    pub eom: Option<u32>,
    pub add_bos: bool,
    /// Whether a space is prepended to the text (`llama` vocabularies only). SentencePiece's
    /// "dummy prefix": on unless `tokenizer.ggml.add_space_prefix` says otherwise.
    pub add_space_prefix: bool,
}

impl Vocabulary {
    /// Reads the `tokenizer.ggml.*` keys of a GGUF file.
    pub fn from_gguf(f: &gguf_loader::GgufFile) -> Result<Vocabulary> {
        const P: &str = "tokenizer.ggml.";
        let key = |k: &str| format!("{P}{k}");
        let has = |k: &str| f.get(&key(k)).is_some();
        let opt_id = |k: &str| -> Result<Option<u32>> {
            Ok(if has(k) {
                Some(f.get_u32(&key(k))?)
            } else {
                None
            })
        };
        let model = f
            .get_str(&key("model"))
            .map_err(|_| {
                DecodeError::Tokenizer(
                    "the model has no tokenizer.ggml.model; it carries no tokenizer".into(),
                )
            })?
            .to_string();
        let strings = |k: &str| -> Result<Vec<String>> {
            Ok(if has(k) {
                f.get_str_array(&key(k))?
                    .into_iter()
                    .map(str::to_string)
                    .collect()
            } else {
                Vec::new()
            })
        };
        let tokens = strings("tokens")?;
        let merges = strings("merges")?;
        let scores = if has("scores") {
            f.get_f32_array(&key("scores"))?
        } else {
            Vec::new()
        };
        let types = if has("token_type") {
            f.get_i32_array(&key("token_type"))?
        } else {
            Vec::new()
        };
        let pre = if has("pre") {
            Some(f.get_str(&key("pre"))?.to_string())
        } else {
            None
        };
        let bos = opt_id("bos_token_id")?;
        let eos = opt_id("eos_token_id")?;
        let eot = opt_id("eot_token_id")?;
        let eom = opt_id("eom_token_id")?;
        let flag = |k: &str, default: bool| -> Result<bool> {
            Ok(if has(k) {
                f.get_bool(&key(k))?
            } else {
                default
            })
        };
        Ok(Vocabulary {
            add_bos: flag("add_bos_token", bos.is_some() && model == "llama")?,
            // SentencePiece adds the dummy prefix by default; byte-level BPE never does.
            add_space_prefix: flag("add_space_prefix", model == "llama")?,
            model,
            pre,
            tokens,
            scores,
            types,
            merges,
            bos,
            eos,
            eot,
            eom,
        })
    }
}
