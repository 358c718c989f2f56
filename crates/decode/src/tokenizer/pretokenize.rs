//! Pre-tokenizers of byte-level BPE vocabularies (`tokenizer.ggml.pre`), as llama.cpp applies
//! them: a list of passes, each splitting every piece so far into its matches and the stretches
//! between them (a stretch no alternative matches is a piece too).
//!
//! The passes of each name are llama.cpp's (`src/llama-vocab.cpp` at d32676d), in [`RECIPES`].
//! Three kinds:
//! - a hand-written scanner for the patterns with the look-ahead `\s+(?!\S)` that most
//!   vocabularies share ([`Scheme`]):
//!   - GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
//!   - Llama 3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
//!   - Qwen 2: as Llama 3 with single digits (`\p{N}`);
//! - a pattern without look-around, matched with the `regex` crate;
//! - a pattern `P|\s+(?!\S)|\s+` (or without the last `|\s+`): `P` matched with the `regex`
//!   crate at each position, then the whitespace rule by hand.
//!
//! Names whose patterns need other look-arounds (gpt-4o, llama4, tekken, ...) or that llama.cpp
//! treats apart (byte-level encoding off, separators added) are errors that say so.
//!
//! Letters in the scanners are `char::is_alphabetic` minus numerics, which differs from `\p{L}`
//! only for the few marks that Unicode also calls alphabetic; the regex passes use the `regex`
//! crate's Unicode classes.

use crate::error::{DecodeError, Result};
use regex::Regex;

/// A hand-written scanner (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Gpt2,
    Llama3,
    Qwen2,
}

/// One pass of a recipe.
#[derive(Clone, Copy, Debug)]
enum Pass {
    Scan(Scheme),
    Pattern(&'static str),
    /// `P|\s+(?!\S)|\s+` when the flag is set, `P|\s+(?!\S)` when not.
    PatternOrSpace(&'static str, bool),
}

/// The passes of a set of `tokenizer.ggml.pre` names.
struct Recipe {
    names: &'static [&'static str],
    passes: &'static [Pass],
    /// A pre-token that is itself a token is emitted whole, unmerged (llama.cpp's
    /// `ignore_merges`).
    ignore_merges: bool,
}

/// llama.cpp's pre-tokenizers, by name (`src/llama-vocab.cpp` at d32676d).
#[rustfmt::skip]
const RECIPES: &[Recipe] = &[
    Recipe {
        names: &["a.x-4.0", "exaone4", "gigachat", "gpt-2", "granite-docling", "jais", "jina-de", "jina-es", "jina-v2-de", "jina-v2-es", "mellum", "modern-bert", "mpt", "olmo", "phi-2", "trillion"],
        passes: &[
            Pass::Scan(Scheme::Gpt2),
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["bailingmoe", "bailingmoe2", "llada-moe"],
        passes: &[
            Pass::PatternOrSpace(r#"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]"#, true),
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["bloom", "gpt3-finnish", "poro-chat"],
        passes: &[
            Pass::Pattern(r#" ?[^(\s|.,!?…。，、।۔،)]+"#),
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["chatglm-bpe", "dbrx", "glm4", "smaug-bpe"],
        passes: &[
            Pass::Scan(Scheme::Llama3),
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["codeshell", "command-r", "exaone", "mellum2", "minerva-7b", "refact", "smollm", "starcoder"],
        passes: &[
            Pass::Pattern(r#"\p{N}"#),
            Pass::Scan(Scheme::Gpt2),
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["deepseek-coder"],
        passes: &[
            Pass::Pattern(r#"[\r\n]"#),
            Pass::Pattern(r#"\s?\p{L}+"#),
            Pass::Pattern(r#"\s?\p{P}+"#),
            Pass::Pattern(r#"[一-龥ࠀ-一가-퟿]+"#),
            Pass::Pattern(r#"\p{N}"#),
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["deepseek-llm"],
        passes: &[
            Pass::Pattern(r#"[\r\n]"#),
            Pass::Pattern(r#"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+"#),
            Pass::Pattern(r#"\s?[!-/:-~！-／：-～‘-‟　-。]+"#),
            Pass::Pattern(r#"\s+$"#),
            Pass::Pattern(r#"[一-龥ࠀ-一가-퟿]+"#),
            Pass::Pattern(r#"\p{N}+"#),
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["deepseek-r1-qwen", "f2llmv2", "grok-2", "hunyuan", "kormo", "megrez", "qwen2", "solar-open", "stablelm2"],
        passes: &[
            Pass::Scan(Scheme::Qwen2),
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["deepseek-v3", "hunyuan-dense", "joyai-llm"],
        passes: &[
            Pass::Pattern(r#"\p{N}{1,3}"#),
            Pass::Pattern(r#"[一-龥぀-ゟ゠-ヿ]+"#),
            Pass::PatternOrSpace(r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+"##, true),
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["default"],
        passes: &[
            Pass::Pattern(r#"[\p{P}\$\+<=>\^~\|]+"#),
            Pass::Scan(Scheme::Gpt2),
            Pass::Pattern(r#"\p{N}+"#),
            Pass::Pattern(r#"[0-9][0-9][0-9]"#),
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["exaone-moe"],
        passes: &[
            Pass::PatternOrSpace(r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]"#, true),
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["falcon"],
        passes: &[
            Pass::Pattern(r#"[\p{P}\$\+<=>\^~\|`]+"#),
            Pass::Scan(Scheme::Gpt2),
            Pass::Pattern(r#"[0-9][0-9][0-9]"#),
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["falcon-h1", "falcon3", "jina-v5-nano", "lfm2", "llama-bpe", "llama-v3", "llama3", "midm-2.0", "pixtral"],
        passes: &[
            Pass::Scan(Scheme::Llama3),
        ],
        ignore_merges: true,
    },
    Recipe {
        names: &["laguna"],
        passes: &[
            Pass::Pattern(r#"[^\n]+|[\n]+"#),
            Pass::Scan(Scheme::Qwen2),
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["minicpm5"],
        passes: &[
            Pass::Pattern(r#"\p{N}{1,3}"#),
            Pass::PatternOrSpace(r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"#, true),
        ],
        ignore_merges: true,
    },
    Recipe {
        names: &["qwen35"],
        passes: &[
            Pass::PatternOrSpace(r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"#, true),
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["seed-coder"],
        passes: &[
            Pass::PatternOrSpace(r#"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"#, true),
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["viking"],
        passes: &[
            Pass::Pattern(r#" ?[^(\s|.,!?…。，、।۔،)]+"#),
            Pass::Pattern(r#"\p{N}"#),
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["youtu"],
        passes: &[
            Pass::Pattern(r#"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+"#),
            Pass::PatternOrSpace(r#"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"#, true),
        ],
        ignore_merges: true,
    },
];

/// A compiled pass.
enum Compiled {
    Scan(Scheme),
    Pattern(Regex),
    /// `P` anchored at the position it is tried at, and whether `\s+` follows the look-ahead.
    PatternOrSpace(Regex, bool),
}

/// The pre-tokenizer of one vocabulary.
pub struct PreTokenizer {
    passes: Vec<Compiled>,
    ignore_merges: bool,
}

impl PreTokenizer {
    /// The pre-tokenizer `pre` names (`None`: llama.cpp's `default`). An unknown name is an
    /// error listing the known ones.
    pub fn for_name(pre: Option<&str>) -> Result<PreTokenizer> {
        let name = pre.unwrap_or("default");
        let recipe = RECIPES
            .iter()
            .find(|r| r.names.contains(&name))
            .ok_or_else(|| {
                DecodeError::Tokenizer(format!(
                    "pre-tokenizer '{name}' (tokenizer.ggml.pre) is not supported; supported: {}",
                    supported_names().join(", ")
                ))
            })?;
        let compile = |p: &str| {
            Regex::new(p).map_err(|e| {
                DecodeError::Tokenizer(format!("pre-tokenizer '{name}': pattern {p:?}: {e}"))
            })
        };
        let passes = recipe
            .passes
            .iter()
            .map(|pass| {
                Ok(match *pass {
                    Pass::Scan(s) => Compiled::Scan(s),
                    Pass::Pattern(p) => Compiled::Pattern(compile(p)?),
                    Pass::PatternOrSpace(p, tail) => {
                        Compiled::PatternOrSpace(compile(&format!("^(?:{p})"))?, tail)
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PreTokenizer {
            passes,
            ignore_merges: recipe.ignore_merges,
        })
    }

    /// Whether a pre-token that is itself a token is emitted whole (Llama 3).
    pub fn ignore_merges(&self) -> bool {
        self.ignore_merges
    }

    /// Splits `text` into pre-tokens.
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut pieces = vec![text];
        for pass in &self.passes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                match pass {
                    Compiled::Scan(scheme) => next.extend(split(*scheme, piece)),
                    Compiled::Pattern(re) => {
                        let mut last = 0;
                        for m in re.find_iter(piece) {
                            // An empty match splits nothing.
                            if m.start() == m.end() {
                                continue;
                            }
                            if m.start() > last {
                                next.push(&piece[last..m.start()]);
                            }
                            next.push(m.as_str());
                            last = m.end();
                        }
                        if last < piece.len() {
                            next.push(&piece[last..]);
                        }
                    }
                    Compiled::PatternOrSpace(re, tail) => {
                        split_pattern_or_space(re, *tail, piece, &mut next)
                    }
                }
            }
            pieces = next;
        }
        pieces
    }
}

/// Every name [`PreTokenizer::for_name`] takes, sorted.
pub fn supported_names() -> Vec<&'static str> {
    let mut names: Vec<&str> = RECIPES
        .iter()
        .flat_map(|r| r.names.iter().copied())
        .collect();
    names.sort_unstable();
    names
}

/// `P|\s+(?!\S)(|\s+)` over `piece`: at each position `P` (anchored) first, then the
/// whitespace rule; characters neither matches gather into the stretch before the next match.
fn split_pattern_or_space<'t>(re: &Regex, tail: bool, piece: &'t str, out: &mut Vec<&'t str>) {
    let mut i = 0;
    let mut gap = 0;
    while i < piece.len() {
        let rest = &piece[i..];
        let matched = match re.find(rest) {
            Some(m) if m.end() > 0 => Some(i + m.end()),
            _ => {
                let ws: usize = rest
                    .chars()
                    .take_while(|c| c.is_whitespace())
                    .map(char::len_utf8)
                    .sum();
                if ws == 0 {
                    None
                } else if i + ws == piece.len() {
                    Some(piece.len())
                } else {
                    // `\s+(?!\S)`: the run but its last character; one alone only with `\s+`.
                    let last = rest[..ws].chars().next_back().map_or(0, char::len_utf8);
                    if ws > last {
                        Some(i + ws - last)
                    } else if tail {
                        Some(i + ws)
                    } else {
                        None
                    }
                }
            }
        };
        match matched {
            Some(end) => {
                if gap < i {
                    out.push(&piece[gap..i]);
                }
                out.push(&piece[i..end]);
                i = end;
                gap = end;
            }
            None => i += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    if gap < piece.len() {
        out.push(&piece[gap..]);
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

/// Splits `text` with one of the scanners.
fn split(scheme: Scheme, text: &str) -> Vec<&str> {
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
        Scheme::Gpt2 => {
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

    fn named(name: &str) -> PreTokenizer {
        PreTokenizer::for_name(Some(name)).unwrap()
    }

    #[test]
    fn starcoder_splits_digits_first_then_each_stretch_as_gpt2() {
        // GPT-2 alone would give "a", " ", " 12"; the stretch "a  " ends before the digit.
        let s = named("smollm");
        assert_eq!(s.split("a  12"), vec!["a", "  ", "1", "2"]);
        assert_eq!(
            s.split("w048 7tuijk"),
            vec!["w", "0", "4", "8", " ", "7", "tuijk"]
        );
    }

    #[test]
    fn every_recipe_compiles_and_the_names_are_unique() {
        let names = supported_names();
        for name in &names {
            PreTokenizer::for_name(Some(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "a name is in two recipes");
        assert!(names.len() >= 60, "{names:?}");
        let e = PreTokenizer::for_name(Some("gpt-4o"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("gpt-4o") && e.contains("deepseek-coder"), "{e}");
    }

    /// The generic pass (`P` by the regex crate, the look-ahead by hand) agrees with the
    /// hand-written Qwen 2 scanner on the same pattern, and both keep every byte.
    #[test]
    fn the_generic_look_ahead_pass_agrees_with_the_scanner() {
        let p = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+";
        let generic = PreTokenizer {
            passes: vec![Compiled::PatternOrSpace(
                Regex::new(&format!("^(?:{p})")).unwrap(),
                true,
            )],
            ignore_merges: false,
        };
        for text in [
            "Hello world's  12 tests!!\n",
            "abc 12345 (x)\n\n  y",
            "x  \n y \t\tz   ",
            "I'M   fine\r\n\r\n\tok?  ",
            "naïve café, 東京 3.14 — ok",
            "",
            "   ",
        ] {
            let got = generic.split(text);
            assert_eq!(got, split(Scheme::Qwen2, text), "{text:?}");
            assert_eq!(got.concat(), text);
        }
    }

    #[test]
    fn default_applies_llama_cpp_s_four_passes() {
        // Punctuation runs first, then GPT-2, then digit runs, then groups of three digits
        // (what is left between them is a piece too).
        let d = named("default");
        assert_eq!(
            d.split("a+b 12345!"),
            vec!["a", "+", "b", " ", "123", "45", "!"]
        );
        let f = named("falcon");
        assert_eq!(f.split("x 1234567"), vec!["x", " ", "123", "456", "7"]);
    }
}
