//! Byte-level BPE over a `gpt2` GGUF vocabulary (Llama 3, Qwen).
//!
//! Text is split by the vocabulary's pre-tokenizer, each piece's UTF-8 bytes are mapped to the
//! printable characters GPT-2 uses for bytes, and the adjacent pair with the lowest merge rank
//! is merged (every occurrence, left to right) until no ranked pair is left.

use super::pretokenize::PreTokenizer;
use super::vocab::{token_type, Vocabulary};
use super::work::Work;
use crate::error::{DecodeError, Result};
use std::collections::HashMap;

pub struct Bpe {
    pre: PreTokenizer,
    ids: HashMap<String, u32>,
    /// (left id, right id) -> (rank, merged id).
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Byte -> id of its single-character token.
    byte_ids: [Option<u32>; 256],
    byte_chars: [char; 256],
    char_bytes: HashMap<char, u8>,
}

/// GPT-2's reversible map from bytes to printable characters.
fn byte_chars() -> [char; 256] {
    let mut map = ['\0'; 256];
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut extra = 0;
    for b in 0..256u32 {
        map[b as usize] = if printable(b) {
            char::from_u32(b).expect("latin-1")
        } else {
            extra += 1;
            char::from_u32(255 + extra).expect("latin extended")
        };
    }
    map
}

impl Bpe {
    pub fn new(v: &Vocabulary) -> Result<Bpe> {
        let pre = PreTokenizer::for_name(v.pre.as_deref())?;
        let mut ids = HashMap::with_capacity(v.tokens.len());
        for (i, t) in v.tokens.iter().enumerate() {
            ids.entry(t.clone()).or_insert(i as u32);
        }
        if v.merges.is_empty() {
            return Err(DecodeError::Tokenizer(
                "a gpt2 vocabulary needs tokenizer.ggml.merges, which the model lacks".into(),
            ));
        }
        let mut merges = HashMap::with_capacity(v.merges.len());
        for (rank, m) in v.merges.iter().enumerate() {
            let (a, b) = m.split_once(' ').ok_or_else(|| {
                DecodeError::Tokenizer(format!(
                    "merge #{rank} '{m}' is not two space-separated symbols"
                ))
            })?;
            if let (Some(&ia), Some(&ib), Some(&im)) =
                (ids.get(a), ids.get(b), ids.get(&format!("{a}{b}")))
            {
                merges.entry((ia, ib)).or_insert((rank as u32, im));
            }
        }
        let byte_chars = byte_chars();
        let mut byte_ids = [None; 256];
        let mut char_bytes = HashMap::new();
        for (b, &c) in byte_chars.iter().enumerate() {
            byte_ids[b] = ids.get(c.to_string().as_str()).copied();
            char_bytes.insert(c, b as u8);
        }
        Ok(Bpe {
            pre,
            ids,
            merges,
            byte_ids,
            byte_chars,
            char_bytes,
        })
    }

    pub fn encode(&self, text: &str, out: &mut Vec<u32>, work: &mut Work) {
        let mut word = String::new();
        let mut syms: Vec<u32> = Vec::new();
        for piece in self.pre.split_counting(text, work) {
            word.clear();
            word.extend(piece.bytes().map(|b| self.byte_chars[b as usize]));
            if self.pre.ignore_merges() {
                if let Some(&id) = self.ids.get(&word) {
                    out.push(id);
                    continue;
                }
            }
            syms.clear();
            // A byte without its own token is dropped: a well-formed byte-level vocabulary
            // has all 256, and the Vocabulary check in `Tokenizer::new` cannot know which.
            syms.extend(piece.bytes().filter_map(|b| self.byte_ids[b as usize]));
            loop {
                work.merge_lookups += syms.len().saturating_sub(1) as u64;
                let best = syms
                    .windows(2)
                    .filter_map(|w| {
                        self.merges
                            .get(&(w[0], w[1]))
                            .map(|&(r, m)| (r, w[0], w[1], m))
                    })
                    .min_by_key(|&(r, ..)| r);
                let Some((_, a, b, m)) = best else { break };
                let mut merged = Vec::with_capacity(syms.len());
                let mut k = 0;
                while k < syms.len() {
                    if k + 1 < syms.len() && syms[k] == a && syms[k + 1] == b {
                        work.merges += 1;
                        merged.push(m);
                        k += 2;
                    } else {
                        merged.push(syms[k]);
                        k += 1;
                    }
                }
                syms = merged;
            }
            out.extend_from_slice(&syms);
        }
    }

    /// What token `i` decodes to: control and user-defined tokens as their text, others
    /// through the byte map.
    pub fn token_bytes(&self, v: &Vocabulary, i: usize) -> Vec<u8> {
        let t = &v.tokens[i];
        let ty = v.types.get(i).copied().unwrap_or(token_type::NORMAL);
        if matches!(ty, token_type::CONTROL | token_type::USER_DEFINED) {
            return t.as_bytes().to_vec();
        }
        let mut out = Vec::with_capacity(t.len());
        for c in t.chars() {
            match self.char_bytes.get(&c) {
                Some(&b) => out.push(b),
                None => {
                    let mut buf = [0; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Tokenizer, Vocabulary};
    use super::byte_chars;

    fn vocab() -> Vocabulary {
        let bc = byte_chars();
        let mut tokens: Vec<String> = bc.iter().map(|c| c.to_string()).collect();
        let g = |s: &str| s.bytes().map(|b| bc[b as usize]).collect::<String>();
        let merges = vec![
            format!("{} {}", g(" "), g("t")),
            format!("{} {}", g("h"), g("e")),
            format!("{} {}", g(" t"), g("he")),
        ];
        for m in &merges {
            tokens.push(m.replace(' ', ""));
        }
        tokens.push("<|end|>".into());
        let mut types = vec![1; tokens.len()];
        *types.last_mut().unwrap() = 3;
        Vocabulary {
            model: "gpt2".into(),
            pre: Some("qwen2".into()),
            tokens,
            types,
            merges,
            eos: Some(259),
            ..Default::default()
        }
    }

    #[test]
    fn merges_follow_rank_and_round_trip() {
        let t = Tokenizer::new(vocab()).unwrap();
        let ids = t.encode("the the<|end|>é", false);
        // "the" -> t + he (rank 1); " the" -> " t"(0) then " t"+"he"(2).
        assert_eq!(ids[0], b't' as u32);
        assert_eq!(ids[1], 257);
        assert_eq!(ids[2], 258);
        assert_eq!(ids[3], 259);
        assert_eq!(t.decode(&ids), "the the<|end|>é");
        assert!(t.is_stop(259));
    }
}
