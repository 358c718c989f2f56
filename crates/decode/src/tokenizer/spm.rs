//! SentencePiece-style BPE over a `llama` GGUF vocabulary (Gemma).
//!
//! The text's spaces become `▁` (with one prepended when `add_space_prefix`), every character
//! starts as its own symbol, and the adjacent pair whose concatenation is a piece with the
//! highest score merges first (the leftmost on ties) until no pair forms a piece. A final
//! symbol that is not a piece is written as its UTF-8 bytes through `<0xXX>` tokens, or the
//! unknown token when the vocabulary has no byte tokens.

use super::vocab::{token_type, Vocabulary};
use crate::error::{DecodeError, Result};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

const SPACE: char = '\u{2581}';

pub struct Spm {
    ids: HashMap<String, u32>,
    scores: Vec<f32>,
    /// `<0xXX>` token per byte value.
    byte_ids: [Option<u32>; 256],
    unk: Option<u32>,
    add_space_prefix: bool,
}

/// A candidate merge of symbols `left` and `right` (indices into the symbol list).
struct Candidate {
    score: f32,
    left: usize,
    right: usize,
    /// Byte length of the merged piece when queued; a later merge of either side makes it stale.
    len: usize,
}

impl PartialEq for Candidate {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Candidate {
    fn cmp(&self, o: &Self) -> Ordering {
        // Highest score first, then leftmost.
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
    }
}

struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Spm {
    pub fn new(v: &Vocabulary) -> Result<Spm> {
        let mut ids = HashMap::with_capacity(v.tokens.len());
        let mut byte_ids = [None; 256];
        let mut unk = None;
        for (i, t) in v.tokens.iter().enumerate() {
            let ty = v.types.get(i).copied().unwrap_or(token_type::NORMAL);
            match ty {
                token_type::BYTE => {
                    let b = t
                        .strip_prefix("<0x")
                        .and_then(|s| s.strip_suffix('>'))
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                        .ok_or_else(|| {
                            DecodeError::Tokenizer(format!(
                                "token {i} '{t}' is typed as a byte but is not written <0xXX>"
                            ))
                        })?;
                    byte_ids[b as usize].get_or_insert(i as u32);
                }
                token_type::UNKNOWN => {
                    unk.get_or_insert(i as u32);
                }
                // Unused pieces never come out of merging.
                token_type::UNUSED => {}
                _ => {
                    ids.entry(t.clone()).or_insert(i as u32);
                }
            }
        }
        Ok(Spm {
            ids,
            scores: if v.scores.is_empty() {
                vec![0.0; v.tokens.len()]
            } else {
                v.scores.clone()
            },
            byte_ids,
            unk,
            add_space_prefix: v.add_space_prefix,
        })
    }

    pub fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let mut norm = String::with_capacity(text.len() + 3);
        if self.add_space_prefix {
            norm.push(SPACE);
        }
        for c in text.chars() {
            norm.push(if c == ' ' { SPACE } else { c });
        }
        let mut syms: Vec<Symbol> = norm
            .char_indices()
            .map(|(start, c)| Symbol {
                start,
                len: c.len_utf8(),
                prev: None,
                next: None,
            })
            .collect();
        let n = syms.len();
        for (i, s) in syms.iter_mut().enumerate() {
            s.prev = i.checked_sub(1);
            s.next = (i + 1 < n).then_some(i + 1);
        }
        let mut heap = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<Candidate>, syms: &[Symbol], l: usize, r: usize| {
            let (a, b) = (&syms[l], &syms[r]);
            let piece = &norm[a.start..b.start + b.len];
            if let Some(&id) = self.ids.get(piece) {
                heap.push(Candidate {
                    score: self.scores[id as usize],
                    left: l,
                    right: r,
                    len: piece.len(),
                });
            }
        };
        for i in 1..n {
            push(&mut heap, &syms, i - 1, i);
        }
        while let Some(c) = heap.pop() {
            let (l, r) = (c.left, c.right);
            if syms[l].len == 0
                || syms[r].len == 0
                || syms[l].next != Some(r)
                || syms[l].len + syms[r].len != c.len
            {
                continue; // stale
            }
            syms[l].len += syms[r].len;
            syms[r].len = 0;
            syms[l].next = syms[r].next;
            if let Some(nn) = syms[r].next {
                syms[nn].prev = Some(l);
            }
            if let Some(p) = syms[l].prev {
                push(&mut heap, &syms, p, l);
            }
            if let Some(nn) = syms[l].next {
                push(&mut heap, &syms, l, nn);
            }
        }
        let mut i = (n > 0).then_some(0);
        while let Some(k) = i {
            let s = &syms[k];
            let piece = &norm[s.start..s.start + s.len];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        if let Some(id) = self.byte_ids[b as usize].or(self.unk) {
                            out.push(id);
                        }
                    }
                }
            }
            i = s.next;
        }
    }
}

/// What token `i` decodes to: its byte for `<0xXX>` tokens, else its text with `▁` as space.
pub fn token_bytes(v: &Vocabulary, i: usize) -> Vec<u8> {
    let t = &v.tokens[i];
    if v.types.get(i).copied() == Some(token_type::BYTE) {
        if let Some(b) = t
            .strip_prefix("<0x")
            .and_then(|s| s.strip_suffix('>'))
            .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            return vec![b];
        }
    }
    t.replace(SPACE, " ").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::super::{token_type as tt, Tokenizer, Vocabulary};

    fn vocab() -> Vocabulary {
        let mut tokens: Vec<String> = ["<unk>", "<bos>", "<eos>", "<turn>"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut types = vec![tt::UNKNOWN, tt::CONTROL, tt::CONTROL, tt::CONTROL];
        let mut scores = vec![0.0; 4];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(tt::BYTE);
            scores.push(0.0);
        }
        // Pieces with merge priorities: "▁h" + "i" -> "▁hi" beats "h" + "i" -> "hi".
        for (p, s) in [
            ("▁", -1.0),
            ("h", -2.0),
            ("i", -2.0),
            ("▁h", -3.0),
            ("hi", -5.0),
            ("▁hi", -4.0),
            ("é", -2.0),
        ] {
            tokens.push(p.to_string());
            types.push(tt::NORMAL);
            scores.push(s);
        }
        Vocabulary {
            model: "llama".into(),
            tokens,
            scores,
            types,
            bos: Some(1),
            eos: Some(2),
            add_bos: true,
            ..Default::default()
        }
    }

    fn id(t: &Tokenizer, s: &str) -> u32 {
        t.vocab().tokens.iter().position(|x| x == s).unwrap() as u32
    }

    #[test]
    fn merges_by_score_and_falls_back_to_bytes() {
        let t = Tokenizer::new(vocab()).unwrap();
        // "▁h" (-3) merges before "hi" (-5); then "▁hi" forms.
        assert_eq!(t.encode(" hi", false), vec![id(&t, "▁hi")]);
        assert_eq!(t.encode("hi", false), vec![id(&t, "hi")]);
        // 'z' has no piece: its byte token.
        assert_eq!(t.encode("z", false), vec![id(&t, "<0x7A>")]);
        // Multi-byte character without a piece: one byte token per UTF-8 byte.
        assert_eq!(
            t.encode("ü", false),
            vec![id(&t, "<0xC3>"), id(&t, "<0xBC>")]
        );
        assert_eq!(t.encode("hi", true)[0], 1);
    }

    #[test]
    fn special_tokens_match_whole_and_round_trip() {
        let t = Tokenizer::new(vocab()).unwrap();
        let ids = t.encode("hi<turn> hié z", false);
        assert_eq!(ids[0], id(&t, "hi"));
        assert_eq!(ids[1], 3);
        assert_eq!(t.decode(&ids), "hi<turn> hié z");
        // A character split over byte tokens streams out whole.
        let ids = t.encode("ü!", false);
        let mut s = super::super::TextStream::new(&t);
        let parts: Vec<String> = ids.iter().map(|&i| s.push(i)).collect();
        assert_eq!(parts, vec!["".to_string(), "ü".into(), "!".into()]);
    }
}
