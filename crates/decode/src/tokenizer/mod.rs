//! Tokenizers built from a GGUF vocabulary.
//!
//! Two kinds, as `tokenizer.ggml.model` names them:
//! - `llama`: SentencePiece-style (Gemma). The GGUF scores are merge priorities: the pair whose
//!   merged piece scores highest is merged first. Spaces are written `▁`; characters with no
//!   piece fall back to `<0xXX>` byte tokens. See [`spm`].
//! - `gpt2`: byte-level BPE (Llama 3, Qwen, SmolLM2) with ranked merges and a pre-tokenizer chosen by
//!   `tokenizer.ggml.pre`. See [`bpe`].
//!
//! Both are written here rather than on the `tokenizers` crate: its Unigram model would read
//! the scores as log-probabilities and segment Gemma text wrongly, and its BPE model has no
//! notion of score-ordered merges with byte fallback; the two algorithms are short. The
//! pre-tokenizers are llama.cpp's pattern lists, on the `regex` crate with the look-ahead
//! `\s+(?!\S)` written by hand ([`supported_pre_tokenizers`] lists the names).
//!
//! Control and user-defined tokens written literally in the text are matched whole first
//! (leftmost, then longest), like the reference under `tests/reference/tokenizer_ref.py`.

pub mod bpe;
mod pretokenize;

pub use pretokenize::supported_names as supported_pre_tokenizers;
pub use pretokenize::REFUSED as REFUSED_PRE_TOKENIZERS;
pub use pretokenize::{PreTokenizer, Recipe, Refused, RECIPES as PRE_TOKENIZER_RECIPES};
pub mod spm;
mod vocab;
mod work;

pub use vocab::{token_type, Vocabulary};
pub use work::Work;

use crate::error::{DecodeError, Result};
use std::collections::HashMap;

/// Texts of end-of-turn tokens that stop generation when the token is control-typed, as the
/// GGUF conventions (and llama.cpp) recognise them where the metadata names no id: Gemma's
/// `<end_of_turn>` is the one this matters for; the others are usually also named by
/// eos/eot ids. Unlike llama.cpp, a token of one of these texts typed as normal text stays
/// normal: it is then part of the vocabulary, not a turn marker.
pub const END_OF_TURN_TEXTS: [&str; 8] = [
    "<end_of_turn>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
];

enum Model {
    Spm(Box<spm::Spm>),
    Bpe(Box<bpe::Bpe>),
}

/// A tokenizer: text to ids and back.
pub struct Tokenizer {
    model: Model,
    vocab: Vocabulary,
    /// Control and user-defined tokens by first character, longest first.
    specials: HashMap<char, Vec<(String, u32)>>,
    /// Bytes each token decodes to.
    bytes: Vec<Vec<u8>>,
    /// Ids that end generation: EOS, EOT, EOM and control-typed end-of-turn tokens.
    stops: Vec<u32>,
}

impl Tokenizer {
    /// Builds the tokenizer a vocabulary describes.
    pub fn new(vocab: Vocabulary) -> Result<Tokenizer> {
        let n = vocab.tokens.len();
        if n == 0 {
            return Err(DecodeError::Tokenizer(
                "the model has no tokenizer.ggml.tokens".into(),
            ));
        }
        for (what, v) in [
            ("scores", vocab.scores.len()),
            ("token_type", vocab.types.len()),
        ] {
            if v != 0 && v != n {
                return Err(DecodeError::Tokenizer(format!(
                    "tokenizer.ggml.{what} has {v} entries for {n} tokens"
                )));
            }
        }
        for (what, id) in [
            ("bos", vocab.bos),
            ("eos", vocab.eos),
            ("eot", vocab.eot),
            ("eom", vocab.eom),
        ] {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(DecodeError::Tokenizer(format!(
                    "tokenizer.ggml.{what}_token_id {id} is outside the {n}-token vocabulary"
                )));
            }
        }
        let model = match vocab.model.as_str() {
            "llama" => Model::Spm(Box::new(spm::Spm::new(&vocab)?)),
            "gpt2" => Model::Bpe(Box::new(bpe::Bpe::new(&vocab)?)),
            other => {
                return Err(DecodeError::Tokenizer(format!(
                    "tokenizer.ggml.model '{other}' is not supported (supported: llama, gpt2)"
                )))
            }
        };
        let mut specials: HashMap<char, Vec<(String, u32)>> = HashMap::new();
        for (i, t) in vocab.tokens.iter().enumerate() {
            let ty = vocab.types.get(i).copied().unwrap_or(token_type::NORMAL);
            if matches!(ty, token_type::CONTROL | token_type::USER_DEFINED) {
                if let Some(c) = t.chars().next() {
                    let list = specials.entry(c).or_default();
                    // The first id wins for duplicate texts.
                    if !list.iter().any(|(s, _)| s == t) {
                        list.push((t.clone(), i as u32));
                    }
                }
            }
        }
        for list in specials.values_mut() {
            list.sort_by_key(|s| std::cmp::Reverse(s.0.len()));
        }
        let bytes = (0..n)
            .map(|i| match &model {
                Model::Spm(_) => spm::token_bytes(&vocab, i),
                Model::Bpe(b) => b.token_bytes(&vocab, i),
            })
            .collect();
        let mut stops: Vec<u32> = [vocab.eos, vocab.eot, vocab.eom]
            .into_iter()
            .flatten()
            .collect();
        for (i, t) in vocab.tokens.iter().enumerate() {
            let control = vocab.types.get(i) == Some(&token_type::CONTROL);
            if control && END_OF_TURN_TEXTS.contains(&t.as_str()) {
                stops.push(i as u32);
            }
        }
        stops.sort_unstable();
        stops.dedup();
        Ok(Tokenizer {
            model,
            vocab,
            specials,
            bytes,
            stops,
        })
    }

    /// The tokenizer a GGUF file describes.
    pub fn from_gguf(f: &gguf_loader::GgufFile) -> Result<Tokenizer> {
        Tokenizer::new(Vocabulary::from_gguf(f)?)
    }

    pub fn vocab(&self) -> &Vocabulary {
        &self.vocab
    }

    pub fn len(&self) -> usize {
        self.vocab.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.vocab.tokens.is_empty()
    }

    /// Encodes text; prepends BOS when `add_bos` and the vocabulary has one.
    pub fn encode(&self, text: &str, add_bos: bool) -> Vec<u32> {
        self.encode_counting(text, add_bos).0
    }

    /// [`Tokenizer::encode`], with the work it did (byte-level BPE vocabularies; a
    /// SentencePiece one counts nothing).
    pub fn encode_counting(&self, text: &str, add_bos: bool) -> (Vec<u32>, Work) {
        let mut work = Work::default();
        let mut ids = Vec::new();
        if add_bos {
            ids.extend(self.vocab.bos);
        }
        let mut start = 0;
        let mut i = 0;
        while i < text.len() {
            let c = text[i..].chars().next().expect("char boundary");
            let hit = self
                .specials
                .get(&c)
                .and_then(|list| list.iter().find(|(s, _)| text[i..].starts_with(s.as_str())));
            match hit {
                Some((s, id)) => {
                    self.encode_plain(&text[start..i], &mut ids, &mut work);
                    ids.push(*id);
                    i += s.len();
                    start = i;
                }
                None => i += c.len_utf8(),
            }
        }
        self.encode_plain(&text[start..], &mut ids, &mut work);
        (ids, work)
    }

    fn encode_plain(&self, text: &str, out: &mut Vec<u32>, work: &mut Work) {
        if text.is_empty() {
            return;
        }
        match &self.model {
            Model::Spm(m) => m.encode(text, out),
            Model::Bpe(m) => m.encode(text, out, work),
        }
    }

    /// The bytes a token stands for.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map_or(&[], |b| b.as_slice())
    }

    /// Decodes ids to text (invalid UTF-8 replaced).
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| self.token_bytes(id).iter().copied())
            .collect();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        match &self.model {
            Model::Spm(_) if self.vocab.add_space_prefix => {
                text.strip_prefix(' ').map(str::to_string).unwrap_or(text)
            }
            _ => text,
        }
    }

    /// Whether generation stops at this token (EOS, EOT, EOM, a control end-of-turn token).
    pub fn is_stop(&self, id: u32) -> bool {
        self.stops.binary_search(&id).is_ok()
    }

    /// Every id that stops generation, ascending.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stops
    }

    /// Whether the token is a control token (not printed while streaming).
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.types.get(id as usize).copied() == Some(token_type::CONTROL)
    }
}

/// Turns a stream of token ids into text pieces that are always whole UTF-8, holding back
/// the bytes of a character split across tokens.
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    pending: Vec<u8>,
}

impl<'a> TextStream<'a> {
    pub fn new(tokenizer: &'a Tokenizer) -> TextStream<'a> {
        TextStream {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// The text that became complete with this token (may be empty).
    pub fn push(&mut self, id: u32) -> String {
        if self.tokenizer.is_control(id) {
            return String::new();
        }
        self.pending
            .extend_from_slice(self.tokenizer.token_bytes(id));
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_some() => self.pending.len(), // invalid, not incomplete
            Err(e) => e.valid_up_to(),
        };
        let done: Vec<u8> = self.pending.drain(..valid).collect();
        String::from_utf8_lossy(&done).into_owned()
    }

    /// Whatever is still held back, flushed lossily.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}
