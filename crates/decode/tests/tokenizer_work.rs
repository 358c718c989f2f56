//! The whole encode (pre-tokenizer and BPE merges) does work linear in the text's length on
//! the inputs that make naive matchers and merge loops quadratic: one long run of digits, of
//! one letter, of spaces. Work is counted (`Tokenizer::encode_counting`), not timed: from 10k
//! to 100k characters each counter may grow at most 12x. The vocabularies are llama.cpp's test
//! ones (`tests/data/vocab`), with their own pre-tokenizers and, on StarCoder's merges, the
//! Llama 3, Qwen 2 and Qwen 3.5 pre-tokenizers (the two scanners and a pattern with the
//! hand-written look-ahead), Kimi K2's (intersected classes with the
//! hand-written look-ahead), and tekken's and gpt-4o's (look-aheads on the backtracking
//! matcher, whose time on these runs was also seen to grow 4x from 10k to 40k characters).

mod common;

use decode::gguf_loader::writer::Value;
use decode::tokenizer::{Tokenizer, Work};
use decode::GgufFile;
use std::path::PathBuf;

fn vocab(name: &str) -> GgufFile {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/vocab")
        .join(format!("ggml-vocab-{name}.gguf"));
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// StarCoder's vocabulary with another `tokenizer.ggml.pre`.
fn starcoder_as(pre: &str) -> GgufFile {
    common::rebuild_gguf(
        &vocab("starcoder"),
        &common::Edits {
            metadata: vec![(
                "tokenizer.ggml.pre".to_string(),
                Some(Value::String(pre.into())),
            )],
            ..Default::default()
        },
    )
}

/// A text of the given length.
type MakeText = fn(usize) -> String;

fn counters(w: &Work) -> [(&'static str, u64); 3] {
    [
        ("matcher steps", w.matcher_steps),
        ("merge lookups", w.merge_lookups),
        ("merges", w.merges),
    ]
}

#[test]
fn encode_work_grows_linearly_on_long_runs() {
    let tokenizers = [
        ("starcoder", vocab("starcoder")),
        ("deepseek-coder", vocab("deepseek-coder")),
        ("falcon", vocab("falcon")),
        ("llama-bpe", starcoder_as("llama-bpe")),
        ("qwen2", starcoder_as("qwen2")),
        ("qwen35", starcoder_as("qwen35")),
        ("tekken", starcoder_as("tekken")),
        ("gpt-4o", starcoder_as("gpt-4o")),
        ("kimi-k2", starcoder_as("kimi-k2")),
    ];
    let inputs: [(&str, MakeText); 3] = [
        ("digits", |n| {
            (0..n).map(|i| char::from(b'0' + (i % 10) as u8)).collect()
        }),
        ("letters", |n| "a".repeat(n)),
        ("spaces", |n| " ".repeat(n)),
    ];
    let mut wrong = Vec::new();
    for (name, file) in &tokenizers {
        let tok = Tokenizer::from_gguf(file).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (what, make) in &inputs {
            let (short, long) = (make(10_000), make(100_000));
            let (ids_short, w_short) = tok.encode_counting(&short, false);
            let (ids_long, w_long) = tok.encode_counting(&long, false);
            // The counts are of real work: the text round-trips and the matcher looked at
            // every character at least once.
            assert_eq!(tok.decode(&ids_short), short, "{name} {what}");
            assert_eq!(tok.decode(&ids_long), long, "{name} {what}");
            assert!(
                w_short.matcher_steps >= 10_000,
                "{name} {what}: {w_short:?}"
            );
            for ((counter, a), (_, b)) in counters(&w_short).into_iter().zip(counters(&w_long)) {
                eprintln!("{name} {what} {counter}: {a} -> {b}");
                if b > 12 * a.max(1) {
                    wrong.push(format!(
                        "{name} {what}: {counter} {a} at 10k chars, {b} at 100k ({:.1}x)",
                        b as f64 / a.max(1) as f64
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
