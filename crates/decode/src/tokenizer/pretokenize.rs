//! Pre-tokenizers of byte-level BPE vocabularies, written as scanners.
//!
//! They reproduce the regular expressions the vocabularies were trained with (`tokenizer.ggml.pre`):
//! - GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
//! - Llama 3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
//! - Qwen 2/3: as Llama 3 with single digits (`\p{N}`).
//! - StarCoder (also SmolLM2's `smollm`): every digit apart (`\p{N}`), then GPT-2's pattern
//!   within each stretch between digits, as llama.cpp applies its two expressions one after
//!   the other (so a look-ahead sees the stretch's end, not the digit after it).
//!
//! A scanner instead of a regex engine because of the look-ahead `(?!\S)`. Letters are
//! `char::is_alphabetic` minus numerics, which differs from `\p{L}` only for the few marks that
//! Unicode also calls alphabetic.

use crate::error::{DecodeError, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Gpt2,
    Llama3,
    Qwen2,
    StarCoder,
}

impl Scheme {
    pub fn from_pre(pre: Option<&str>) -> Result<Scheme> {
        match pre.unwrap_or("default") {
            "default" | "gpt2" | "gpt-2" => Ok(Scheme::Gpt2),
            "llama-bpe" | "llama3" | "llama-v3" | "smaug-bpe" => Ok(Scheme::Llama3),
            "qwen2" | "qwen3" | "qwen35" => Ok(Scheme::Qwen2),
            "starcoder" | "smollm" => Ok(Scheme::StarCoder),
            other => Err(DecodeError::Tokenizer(format!(
                "pre-tokenizer '{other}' (tokenizer.ggml.pre) is not supported; supported: \
                 default, gpt2, llama-bpe, qwen2, starcoder, smollm"
            ))),
        }
    }
}

fn is_letter(c: char) -> bool {
    c.is_alphabetic() && !c.is_numeric()
}
fn is_number(c: char) -> bool {
    c.is_numeric()
}
fn is_other(c: char) -> bool {
    !c.is_whitespace() && !is_letter(c) && !is_number(c)
}
fn is_newline(c: char) -> bool {
    c == '\r' || c == '\n'
}

/// Splits `text` into pre-tokens.
pub fn split(scheme: Scheme, text: &str) -> Vec<&str> {
    if scheme == Scheme::StarCoder {
        return split_digits_then_gpt2(text);
    }
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let n = chars.len();
    let at = |i: usize| chars.get(i).map(|&(_, c)| c);
    let byte = |i: usize| chars.get(i).map_or(text.len(), |&(b, _)| b);
    let run = |mut i: usize, f: &dyn Fn(char) -> bool| {
        while at(i).is_some_and(f) {
            i += 1;
        }
        i
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < n {
        let end = match_at(scheme, &chars, i, &at, &run);
        debug_assert!(end > i);
        out.push(&text[byte(i)..byte(end)]);
        i = end;
    }
    out
}

/// StarCoder's two passes: each digit alone, and GPT-2's split of every stretch between.
fn split_digits_then_gpt2(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut stretch = 0;
    for (b, c) in text.char_indices() {
        if is_number(c) {
            if stretch < b {
                out.extend(split(Scheme::Gpt2, &text[stretch..b]));
            }
            out.push(&text[b..b + c.len_utf8()]);
            stretch = b + c.len_utf8();
        }
    }
    if stretch < text.len() {
        out.extend(split(Scheme::Gpt2, &text[stretch..]));
    }
    out
}

/// `run(i, class)`: the index after the longest run of `class` characters starting at `i`.
type RunFn<'a> = &'a dyn Fn(usize, &dyn Fn(char) -> bool) -> usize;

fn match_at(
    scheme: Scheme,
    chars: &[(usize, char)],
    i: usize,
    at: &dyn Fn(usize) -> Option<char>,
    run: RunFn<'_>,
) -> usize {
    let c = chars[i].1;
    let insensitive = scheme != Scheme::Gpt2;
    // Contractions.
    if c == '\'' {
        for suffix in ["s", "t", "re", "ve", "m", "ll", "d"] {
            let ok = suffix.chars().enumerate().all(|(k, s)| {
                at(i + 1 + k).is_some_and(|x| {
                    if insensitive {
                        x.to_lowercase().eq(std::iter::once(s))
                    } else {
                        x == s
                    }
                })
            });
            if ok {
                return i + 1 + suffix.len();
            }
        }
    }
    match scheme {
        // Split before scanning (`split_digits_then_gpt2`), which scans its stretches as GPT-2.
        Scheme::Gpt2 | Scheme::StarCoder => {
            let body = if c == ' ' { i + 1 } else { i };
            if at(body).is_some_and(is_letter) {
                return run(body, &is_letter);
            }
            if at(body).is_some_and(is_number) {
                return run(body, &is_number);
            }
            if at(body).is_some_and(is_other) {
                return run(body, &is_other);
            }
        }
        Scheme::Llama3 | Scheme::Qwen2 => {
            // [^\r\n\p{L}\p{N}]?\p{L}+
            if is_letter(c) {
                return run(i, &is_letter);
            }
            if !is_newline(c) && !is_number(c) && at(i + 1).is_some_and(is_letter) {
                return run(i + 1, &is_letter);
            }
            if is_number(c) {
                let max = if scheme == Scheme::Llama3 { 3 } else { 1 };
                let end = run(i, &is_number);
                return end.min(i + max);
            }
            // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
            let body = if c == ' ' { i + 1 } else { i };
            if at(body).is_some_and(is_other) {
                let end = run(body, &is_other);
                return run(end, &is_newline);
            }
            // `\s*[\r\n]+`: up to and including the last newline of the whitespace run.
            let ws_end = run(i, &|x: char| x.is_whitespace());
            if let Some(last_nl) = (i..ws_end).rev().find(|&k| at(k).is_some_and(is_newline)) {
                return last_nl + 1;
            }
        }
    }
    // `\s+(?!\S)` then `\s+`.
    let ws_end = run(i, &|x: char| x.is_whitespace());
    if ws_end > i {
        if ws_end == chars.len() || ws_end - i == 1 {
            return ws_end;
        }
        return ws_end - 1;
    }
    // Unreachable in practice (every char is whitespace, letter, number or other); never stall.
    i + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_splits_like_its_regex() {
        assert_eq!(
            split(Scheme::Gpt2, "Hello world's  12 tests!!\n"),
            vec!["Hello", " world", "'s", " ", " 12", " tests", "!!", "\n"]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three_and_keeps_newlines_together() {
        assert_eq!(
            split(Scheme::Llama3, "abc 12345 (x)\n\n  y"),
            vec!["abc", " ", "123", "45", " (", "x", ")\n\n", " ", " y"]
        );
        assert_eq!(split(Scheme::Qwen2, "a 42"), vec!["a", " ", "4", "2"]);
        assert_eq!(split(Scheme::Llama3, "I'M"), vec!["I", "'M"]);
        assert_eq!(split(Scheme::Llama3, "x  \n y"), vec!["x", "  \n", " y"]);
    }

    #[test]
    fn starcoder_splits_digits_first_then_each_stretch_as_gpt2() {
        // GPT-2 alone would give "a", " ", " 12"; the stretch "a  " ends before the digit.
        assert_eq!(split(Scheme::StarCoder, "a  12"), vec!["a", "  ", "1", "2"]);
        assert_eq!(
            split(Scheme::StarCoder, "w048 7tuijk"),
            vec!["w", "0", "4", "8", " ", "7", "tuijk"]
        );
    }
}
