//! Pre-tokenizers of byte-level BPE vocabularies (`tokenizer.ggml.pre`), as llama.cpp applies
//! them: a list of patterns, each splitting every piece so far into its matches and the
//! stretches between them (a stretch no alternative matches is a piece too).
//!
//! [`RECIPES`] holds llama.cpp's pattern strings for each name (`src/llama-vocab.cpp` at
//! d32676d) exactly as written there, so a test can compare them with that file
//! (`tests/pre_tokenizers.rs`). Each pattern is run one of three ways:
//! - a hand-written scanner for the three patterns with the look-ahead `\s+(?!\S)` that most
//!   vocabularies share ([`Scheme`]): GPT-2's, Llama 3's and Qwen 2's (Llama 3's with single
//!   digits);
//! - a pattern without look-around, matched with the `regex` crate;
//! - a pattern `P|\s+(?!\S)|\s+` (or without the last `|\s+`): `P` matched with the `regex`
//!   crate at each position, then the whitespace rule by hand;
//! - llama.cpp's trigger `\p{Han}+` (kimi-k2): the pattern it stands for, Kimi K2's own
//!   (`pat_str` of its `tokenization_kimi.py`, see [`Recipe::patterns_run`]), as a pattern with the
//!   whitespace rule;
//! - any other pattern with look-arounds (tekken's, gpt-4o's, granite-embed-multi-97m's):
//!   `fancy-regex`,
//!   a backtracking matcher that takes the `regex` crate's Unicode classes, as Python's `regex`
//!   and llama.cpp's `std::regex` backtrack.
//!
//! Names whose look-aheads make matching quadratic (tiny_aya's digit groups, jais-2's cascade of
//! whitespace runs, ...) or that llama.cpp treats apart (byte-level encoding off, separators
//! added, custom matchers) are in [`REFUSED`]: errors that say why.
//!
//! Letters and numbers in the scanners are the Unicode general categories `L` and `N`, taken
//! from the `regex` crate's tables so the scanners and the regex passes agree on every code
//! point (`char::is_alphabetic` would also count the vowel signs of Devanagari, Bengali, Thai,
//! Arabic, ... as letters, which `\p{L}` does not).

use super::work::Work;
use crate::error::{DecodeError, Result};
use regex::Regex;
use std::sync::OnceLock;

/// A hand-written scanner (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Gpt2,
    Llama3,
    Qwen2,
}

impl Scheme {
    /// The llama.cpp pattern the scanner implements. GPT-2's has no final `|\s+`: a single
    /// whitespace character before a non-space that nothing else matches is then a stretch
    /// of its own, which is the piece `\s+` would have made, so the scanner can match it.
    const fn pattern(self) -> &'static str {
        match self {
            Scheme::Gpt2 => {
                r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
            }
            Scheme::Llama3 => {
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            }
            Scheme::Qwen2 => {
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            }
        }
    }
}

/// A set of `tokenizer.ggml.pre` names and llama.cpp's patterns for them.
#[derive(Debug)]
pub struct Recipe {
    pub names: &'static [&'static str],
    /// llama.cpp's `regex_exprs`, in order, as the C++ literals spell them (C++ and Rust
    /// escapes agree for these).
    pub patterns: &'static [&'static str],
    /// A pre-token that is itself a token is emitted whole, unmerged (llama.cpp's
    /// `ignore_merges`).
    pub ignore_merges: bool,
}

/// A name llama.cpp knows that is refused here, and why.
#[derive(Debug)]
pub struct Refused {
    pub name: &'static str,
    pub reason: &'static str,
}

const QUADRATIC: &str = "its look-ahead makes matching quadratic in a long run of digits or \
                         spaces, which a request could use to stall the tokenizer";
const NO_BYTE_MAP: &str = "llama.cpp encodes it without GPT-2's byte map";
const SEPARATORS: &str = "llama.cpp adds separator tokens around its text";
const CUSTOM: &str = "llama.cpp splits it with a matcher of its own, not a pattern";

/// llama.cpp's names that [`PreTokenizer::for_name`] refuses.
#[rustfmt::skip]
pub const REFUSED: &[Refused] = &[
    Refused { name: "cohere2moe", reason: QUADRATIC },
    Refused { name: "jais-2", reason: QUADRATIC },
    Refused { name: "superbpe", reason: QUADRATIC },
    Refused { name: "tiny_aya", reason: QUADRATIC },
    Refused { name: "afmoe", reason: CUSTOM },
    Refused { name: "chameleon", reason: "llama.cpp splits its image and sentinel tokens apart" },
    Refused { name: "gemma4", reason: NO_BYTE_MAP },
    Refused { name: "granite-embed-multi-311m", reason: NO_BYTE_MAP },
    Refused { name: "jina-v1-en", reason: SEPARATORS },
    Refused { name: "jina-v2-code", reason: SEPARATORS },
    Refused { name: "roberta-bpe", reason: SEPARATORS },
    Refused { name: "sarvam-moe", reason: NO_BYTE_MAP },
    Refused { name: "whitespace", reason: NO_BYTE_MAP },
];

/// llama.cpp's pre-tokenizers, by name (`src/llama-vocab.cpp` at d32676d).
#[rustfmt::skip]
pub const RECIPES: &[Recipe] = &[
    Recipe {
        names: &["a.x-4.0", "exaone4", "gigachat", "gpt-2", "granite-docling", "jais", "jina-de", "jina-es", "jina-v2-de", "jina-v2-es", "mellum", "modern-bert", "mpt", "olmo", "phi-2", "trillion"],
        patterns: &[
            r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["bailingmoe", "bailingmoe2", "llada-moe"],
        patterns: &[
            r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["bloom", "gpt3-finnish", "poro-chat"],
        patterns: &[
            r" ?[^(\s|.,!?…。，、।۔،)]+",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["chatglm-bpe", "dbrx", "glm4", "smaug-bpe"],
        patterns: &[
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["codeshell", "command-r", "exaone", "mellum2", "minerva-7b", "refact", "smollm", "starcoder"],
        patterns: &[
            r"\p{N}",
            r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["deepseek-coder"],
        patterns: &[
            "[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            r"[一-龥ࠀ-一가-퟿]+",
            r"\p{N}",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["deepseek-llm"],
        patterns: &[
            "[\r\n]",
            r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
            r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
            r"\s+$",
            r"[一-龥ࠀ-一가-퟿]+",
            r"\p{N}+",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["deepseek-r1-qwen", "f2llmv2", "grok-2", "hunyuan", "kormo", "megrez", "qwen2", "solar-open", "stablelm2"],
        patterns: &[
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["deepseek-v3", "hunyuan-dense", "joyai-llm"],
        patterns: &[
            r"\p{N}{1,3}",
            r"[一-龥぀-ゟ゠-ヿ]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["default"],
        patterns: &[
            r"[\p{P}\$\+<=>\^~\|]+",
            r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
            r"\p{N}+",
            r"[0-9][0-9][0-9]",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["exaone-moe"],
        patterns: &[
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["falcon"],
        patterns: &[
            r"[\p{P}\$\+<=>\^~\|`]+",
            r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
            r"[0-9][0-9][0-9]",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["falcon-h1", "falcon3", "jina-v5-nano", "lfm2", "llama-bpe", "llama-v3", "llama3", "midm-2.0", "pixtral"],
        patterns: &[
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: true,
    },
    Recipe {
        names: &["laguna"],
        patterns: &[
            r"[^\n]+|[\n]+",
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["minicpm5"],
        patterns: &[
            r"\p{N}{1,3}",
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: true,
    },
    Recipe {
        names: &["qwen35"],
        patterns: &[
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["seed-coder"],
        patterns: &[
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["viking"],
        patterns: &[
            r" ?[^(\s|.,!?…。，、।۔،)]+",
            r"\p{N}",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["youtu"],
        patterns: &[
            r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: true,
    },
    Recipe {
        names: &["kimi-k2"],
        patterns: &[
            KIMI_K2_TRIGGER,
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["tekken"],
        patterns: &[
            r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: true,
    },
    Recipe {
        names: &["gpt-4o", "kanana2", "llama4", "minimax-m2", "talkie"],
        patterns: &[
            r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: false,
    },
    Recipe {
        names: &["granite-embed-multi-97m"],
        patterns: &[
            r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: true,
    },
];

/// llama.cpp's whole pattern list for kimi-k2: a string its splitter recognises and answers
/// with a matcher of its own, written after Kimi K2's pattern.
const KIMI_K2_TRIGGER: &str = r"\p{Han}+";

/// Kimi K2's pattern, from the `pat_str` of its `tokenization_kimi.py` (tiktoken, whose
/// matcher reads `&&` as class intersection and a bare script name as the script extension,
/// as the `regex` crate does). llama.cpp's hand-written matcher for it approximates it: it
/// does not split a word where lower case turns to upper (`camelCase`), counts marks apart
/// from letters, and takes Han from block ranges. This runs the pattern itself, so the
/// pieces are those the model was trained on.
const KIMI_K2: &str = r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pattern a pass of [`RECIPES`] runs: the recipe's own string, except where llama.cpp
/// writes a trigger for a matcher of its own (kimi-k2's), which runs the pattern that
/// matcher was written after.
fn runs_as(pattern: &'static str) -> &'static str {
    if pattern == KIMI_K2_TRIGGER {
        KIMI_K2
    } else {
        pattern
    }
}

impl Recipe {
    /// The patterns its passes run, in order: [`Recipe::patterns`] with llama.cpp's triggers
    /// replaced by what they stand for.
    pub fn patterns_run(&self) -> Vec<&'static str> {
        self.patterns.iter().map(|p| runs_as(p)).collect()
    }
}

/// A compiled pass.
enum Compiled {
    Scan(Scheme),
    Pattern(Regex),
    /// `P` anchored at the position it is tried at, and whether `\s+` follows the look-ahead.
    PatternOrSpace(Regex, bool),
    /// A pattern with look-arounds, backtracking.
    LookAround(fancy_regex::Regex),
}

/// How one of llama.cpp's patterns is run here (see the module docs), or why it cannot be.
fn compile(name: &str, pattern: &'static str) -> Result<Compiled> {
    let pattern = runs_as(pattern);
    let regex = |p: &str| {
        Regex::new(p).map_err(|e| {
            DecodeError::Tokenizer(format!("pre-tokenizer '{name}': pattern {pattern:?}: {e}"))
        })
    };
    for scheme in [Scheme::Gpt2, Scheme::Llama3, Scheme::Qwen2] {
        if pattern == scheme.pattern() {
            return Ok(Compiled::Scan(scheme));
        }
    }
    for (suffix, tail) in [(r"|\s+(?!\S)|\s+", true), (r"|\s+(?!\S)", false)] {
        if let Some(p) = pattern.strip_suffix(suffix) {
            // The suffix must be an alternative of the whole pattern: `P` alone then parses
            // (it would not if the suffix closed a group), and has no look-around left.
            if !p.contains("(?=") && !p.contains("(?!") && !p.contains("(?<") {
                return Ok(Compiled::PatternOrSpace(regex(&format!("^(?:{p})"))?, tail));
            }
        }
    }
    if pattern.contains("(?=") || pattern.contains("(?!") || pattern.contains("(?<") {
        return fancy_regex::Regex::new(pattern)
            .map(Compiled::LookAround)
            .map_err(|e| {
                DecodeError::Tokenizer(format!("pre-tokenizer '{name}': pattern {pattern:?}: {e}"))
            });
    }
    regex(pattern).map(Compiled::Pattern)
}

/// The pre-tokenizer of one vocabulary.
pub struct PreTokenizer {
    passes: Vec<Compiled>,
    ignore_merges: bool,
}

impl PreTokenizer {
    /// The pre-tokenizer `pre` names (`None`: llama.cpp's `default`). An unknown or refused
    /// name is an error that says so (listing the known ones).
    pub fn for_name(pre: Option<&str>) -> Result<PreTokenizer> {
        let name = pre.unwrap_or("default");
        if let Some(r) = REFUSED.iter().find(|r| r.name == name) {
            return Err(DecodeError::Tokenizer(format!(
                "pre-tokenizer '{name}' (tokenizer.ggml.pre) is not supported: {}; supported: {}",
                r.reason,
                supported_names().join(", ")
            )));
        }
        let recipe = RECIPES
            .iter()
            .find(|r| r.names.contains(&name))
            .ok_or_else(|| {
                DecodeError::Tokenizer(format!(
                    "pre-tokenizer '{name}' (tokenizer.ggml.pre) is not supported; supported: {}",
                    supported_names().join(", ")
                ))
            })?;
        let passes = recipe
            .patterns
            .iter()
            .map(|p| compile(name, p))
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
        self.split_counting(text, &mut Work::default())
    }

    /// [`PreTokenizer::split`], adding the matcher's steps to `work.matcher_steps`: one per
    /// character a scanner looks at, per byte a regex pass searches, and per position an
    /// anchored pattern is tried at plus the bytes it matched. What the `regex` crate does
    /// inside one search is not counted; its searches take time linear in what they search.
    pub fn split_counting<'t>(&self, text: &'t str, work: &mut Work) -> Vec<&'t str> {
        let mut pieces = vec![text];
        for pass in &self.passes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                match pass {
                    Compiled::Scan(scheme) => split(*scheme, piece, &mut next, work),
                    Compiled::Pattern(re) => {
                        work.matcher_steps += piece.len() as u64;
                        let spans = re.find_iter(piece).map(|m| m.range());
                        split_at_matches(piece, spans, &mut next);
                    }
                    Compiled::LookAround(re) => {
                        work.matcher_steps += piece.len() as u64;
                        let mut spans = Vec::new();
                        for m in re.find_iter(piece) {
                            match m {
                                Ok(m) => spans.push(m.range()),
                                Err(e) => {
                                    // The matcher's only run-time error: a search took more
                                    // than its backtracking limit (a million backtracks). The
                                    // accepted patterns stay far below it on long runs of one
                                    // character class; should text ever reach it, the rest of
                                    // the piece stays one pre-token: the encoding still spells
                                    // the text, but its tokens may differ from llama.cpp's.
                                    work.matcher_limits += 1;
                                    tracing::warn!(
                                        "pre-tokenizer pattern gave up on a {} byte piece \
                                         ({e}); it stays one pre-token",
                                        piece.len() - spans.last().map_or(0, |r| r.end)
                                    );
                                    break;
                                }
                            }
                        }
                        split_at_matches(piece, spans.into_iter(), &mut next);
                    }
                    Compiled::PatternOrSpace(re, tail) => {
                        split_pattern_or_space(re, *tail, piece, &mut next, work)
                    }
                }
            }
            pieces = next;
        }
        pieces
    }
}

/// `piece` cut into the non-empty `matches` (in order, not overlapping) and the stretches
/// between them; an empty match splits nothing.
fn split_at_matches<'t>(
    piece: &'t str,
    matches: impl Iterator<Item = std::ops::Range<usize>>,
    out: &mut Vec<&'t str>,
) {
    let mut last = 0;
    for m in matches {
        if m.start == m.end {
            continue;
        }
        if m.start > last {
            out.push(&piece[last..m.start]);
        }
        out.push(&piece[m.clone()]);
        last = m.end;
    }
    if last < piece.len() {
        out.push(&piece[last..]);
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
fn split_pattern_or_space<'t>(
    re: &Regex,
    tail: bool,
    piece: &'t str,
    out: &mut Vec<&'t str>,
    work: &mut Work,
) {
    let mut i = 0;
    let mut gap = 0;
    while i < piece.len() {
        let rest = &piece[i..];
        work.matcher_steps += 1;
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
                work.matcher_steps += (end - i) as u64;
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

/// Code point ranges (inclusive) of the general categories `L` and `N`.
struct Classes {
    letters: Vec<(u32, u32)>,
    numbers: Vec<(u32, u32)>,
}

/// The `regex` crate's `\p{L}` and `\p{N}` as ranges: std has no general category, and
/// asking the regex crate keeps the scanners on the same Unicode version as the regex passes.
/// Built once, by matching each class over a string of every scalar value (a few ms).
fn classes() -> &'static Classes {
    static CLASSES: OnceLock<Classes> = OnceLock::new();
    CLASSES.get_or_init(|| {
        let all: String = (0..=char::MAX as u32).filter_map(char::from_u32).collect();
        let ranges = |class: &str| {
            let re = Regex::new(&format!("{class}+")).expect("a Unicode class compiles");
            re.find_iter(&all)
                .filter_map(|m| {
                    let first = m.as_str().chars().next()? as u32;
                    let last = m.as_str().chars().next_back()? as u32;
                    Some((first, last))
                })
                .collect()
        };
        Classes {
            letters: ranges(r"\p{L}"),
            numbers: ranges(r"\p{N}"),
        }
    })
}

fn in_ranges(ranges: &[(u32, u32)], c: char) -> bool {
    let c = c as u32;
    ranges
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    in_ranges(&classes().letters, c)
}
fn is_number(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    in_ranges(&classes().numbers, c)
}
fn is_other(c: char) -> bool {
    !c.is_whitespace() && !is_letter(c) && !is_number(c)
}
fn is_newline(c: char) -> bool {
    c == '\r' || c == '\n'
}

/// The characters of one piece, for a scanner, counting what it looks at.
struct Cursor<'a, 'w> {
    chars: &'a [(usize, char)],
    work: &'w mut Work,
}

impl Cursor<'_, '_> {
    fn at(&mut self, i: usize) -> Option<char> {
        self.work.matcher_steps += 1;
        self.chars.get(i).map(|&(_, c)| c)
    }

    fn is(&mut self, i: usize, f: impl Fn(char) -> bool) -> bool {
        self.at(i).is_some_and(f)
    }

    /// The index after the longest run of `f` characters from `i`, at most `max` of them.
    fn run_max(&mut self, mut i: usize, max: usize, f: impl Fn(char) -> bool) -> usize {
        let end = i.saturating_add(max);
        while i < end && self.is(i, &f) {
            i += 1;
        }
        i
    }

    fn run(&mut self, i: usize, f: impl Fn(char) -> bool) -> usize {
        self.run_max(i, usize::MAX, f)
    }
}

/// Splits `text` with one of the scanners, onto `out`.
fn split<'t>(scheme: Scheme, text: &'t str, out: &mut Vec<&'t str>, work: &mut Work) {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let byte = |i: usize| chars.get(i).map_or(text.len(), |&(b, _)| b);
    let mut cur = Cursor {
        chars: &chars,
        work,
    };
    let mut i = 0;
    while i < chars.len() {
        let end = match_at(scheme, &mut cur, i);
        debug_assert!(end > i);
        out.push(&text[byte(i)..byte(end)]);
        i = end;
    }
}

/// The end (a char index) of the scanner's match at `i`.
fn match_at(scheme: Scheme, cur: &mut Cursor<'_, '_>, i: usize) -> usize {
    let n = cur.chars.len();
    let c = cur.chars[i].1;
    let insensitive = scheme != Scheme::Gpt2;
    // Contractions.
    if c == '\'' {
        for suffix in ["s", "t", "re", "ve", "m", "ll", "d"] {
            let mut ok = true;
            for (k, s) in suffix.chars().enumerate() {
                // `[sS]`-style classes: the ASCII letter in either case, nothing else.
                let same = |x: char| {
                    if insensitive {
                        x.to_ascii_lowercase() == s
                    } else {
                        x == s
                    }
                };
                if !cur.is(i + 1 + k, same) {
                    ok = false;
                    break;
                }
            }
            if ok {
                return i + 1 + suffix.len();
            }
        }
    }
    match scheme {
        Scheme::Gpt2 => {
            let body = if c == ' ' { i + 1 } else { i };
            if cur.is(body, is_letter) {
                return cur.run(body, is_letter);
            }
            if cur.is(body, is_number) {
                return cur.run(body, is_number);
            }
            if cur.is(body, is_other) {
                return cur.run(body, is_other);
            }
        }
        Scheme::Llama3 | Scheme::Qwen2 => {
            // [^\r\n\p{L}\p{N}]?\p{L}+
            if is_letter(c) {
                return cur.run(i, is_letter);
            }
            if !is_newline(c) && !is_number(c) && cur.is(i + 1, is_letter) {
                return cur.run(i + 1, is_letter);
            }
            if is_number(c) {
                // `\p{N}{1,3}` / `\p{N}`: look no further than the digits taken, so a long
                // run of digits costs its length, not its length squared.
                let max = if scheme == Scheme::Llama3 { 3 } else { 1 };
                return cur.run_max(i, max, is_number);
            }
            // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
            let body = if c == ' ' { i + 1 } else { i };
            if cur.is(body, is_other) {
                let end = cur.run(body, is_other);
                return cur.run(end, is_newline);
            }
            // `\s*[\r\n]+`: up to and including the last newline of the whitespace run.
            let ws_end = cur.run(i, char::is_whitespace);
            if let Some(last_nl) = (i..ws_end).rev().find(|&k| cur.is(k, is_newline)) {
                return last_nl + 1;
            }
            // `\s+(?!\S)` then `\s+`, on the run just measured.
            if ws_end > i {
                return if ws_end == n || ws_end - i == 1 {
                    ws_end
                } else {
                    ws_end - 1
                };
            }
        }
    }
    // `\s+(?!\S)` then `\s+`.
    let ws_end = cur.run(i, char::is_whitespace);
    if ws_end > i {
        if ws_end == n || ws_end - i == 1 {
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

    fn scan(scheme: Scheme, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        split(scheme, text, &mut out, &mut Work::default());
        out
    }

    #[test]
    fn gpt2_splits_like_its_regex() {
        assert_eq!(
            scan(Scheme::Gpt2, "Hello world's  12 tests!!\n"),
            vec!["Hello", " world", "'s", " ", " 12", " tests", "!!", "\n"]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three_and_keeps_newlines_together() {
        assert_eq!(
            scan(Scheme::Llama3, "abc 12345 (x)\n\n  y"),
            vec!["abc", " ", "123", "45", " (", "x", ")\n\n", " ", " y"]
        );
        assert_eq!(scan(Scheme::Qwen2, "a 42"), vec!["a", " ", "4", "2"]);
        assert_eq!(scan(Scheme::Llama3, "I'M"), vec!["I", "'M"]);
        assert_eq!(scan(Scheme::Llama3, "x  \n y"), vec!["x", "  \n", " y"]);
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
    fn kimi_k2_runs_its_own_pattern_not_llama_cpp_s_trigger() {
        // The trigger alone would cut only the Han run out. Kimi K2's pattern also splits a
        // word where lower case turns upper, keeps the contraction with its word, and leaves
        // a space before Han on its own.
        assert_eq!(
            named("kimi-k2").split("HelloWorld 你好世界abc's 12345"),
            ["Hello", "World", " ", "你好世界", "abc's", " ", "123", "45"]
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
        let e = PreTokenizer::for_name(Some("tiny_aya"))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("tiny_aya") && e.contains("deepseek-coder"),
            "{e}"
        );
        assert!(e.contains("quadratic"), "{e}");
        for r in REFUSED {
            assert!(
                !names.contains(&r.name),
                "{} is both supported and refused",
                r.name
            );
        }
    }

    /// The three patterns most vocabularies share run on the scanners, the others on the
    /// regex crate: a drift between [`Scheme::pattern`] and the table would send them all to
    /// the slower generic pass.
    #[test]
    fn shared_patterns_run_on_the_scanners() {
        let kinds = |name: &str| -> Vec<String> {
            named(name)
                .passes
                .iter()
                .map(|p| match p {
                    Compiled::Scan(s) => format!("{s:?}"),
                    Compiled::Pattern(_) => "pattern".into(),
                    Compiled::PatternOrSpace(_, tail) => format!("pattern+space({tail})"),
                    Compiled::LookAround(_) => "look-around".into(),
                })
                .collect()
        };
        assert_eq!(kinds("gpt-2"), ["Gpt2"]);
        assert_eq!(kinds("llama-bpe"), ["Llama3"]);
        assert_eq!(kinds("qwen2"), ["Qwen2"]);
        assert_eq!(kinds("smollm"), ["pattern", "Gpt2"]);
        assert_eq!(kinds("qwen35"), ["pattern+space(true)"]);
        assert_eq!(kinds("bloom"), ["pattern"]);
        assert_eq!(kinds("tekken"), ["look-around"]);
    }

    #[test]
    fn letters_and_numbers_are_general_categories() {
        // Vowel signs are alphabetic but marks (`\p{M}`), not letters.
        for c in ['\u{93e}', '\u{9be}', '\u{e31}', '\u{650}', '\u{301}'] {
            assert!(c.is_alphabetic() || c == '\u{301}');
            assert!(!is_letter(c), "{c:?}");
        }
        for c in ['a', 'ß', 'न', 'ก', 'ب', '한', '東', '𝒜'] {
            assert!(is_letter(c), "{c:?}");
        }
        for c in ['7', '٣', '१', '½', 'Ⅻ', '𝟘'] {
            assert!(is_number(c) && !is_letter(c), "{c:?}");
        }
        for c in [' ', '\u{200d}', '👍', '.', '\u{10ffff}'] {
            assert!(!is_letter(c) && !is_number(c), "{c:?}");
        }
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
            assert_eq!(got, scan(Scheme::Qwen2, text), "{text:?}");
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
