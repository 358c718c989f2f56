//! llama.cpp's tokenizer test cases on three vocabularies, each with its own pre-tokenizer:
//! StarCoder (the one SmolLM2 uses, `smollm`), DeepSeek Coder and Falcon. Each case encoded
//! without special tokens must give exactly the ids llama.cpp gives; one mismatch fails. The
//! data and its source are in `tests/data/vocab/`.

mod common;

use decode::gguf_loader::writer::Value;
use decode::tokenizer::Tokenizer;
use decode::GgufFile;
use std::path::PathBuf;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/vocab")
        .join(name)
}

/// Every case of `ggml-vocab-<name>.gguf` against llama.cpp's ids.
fn cases_encode_as_llama_cpp_encodes_them(name: &str) {
    let vocab = format!("ggml-vocab-{name}.gguf");
    let file = GgufFile::open(data(&vocab)).expect("the vocabulary opens");
    let tok = Tokenizer::from_gguf(&file).expect("the pre-tokenizer is supported");
    let inputs = std::fs::read_to_string(data(&format!("{vocab}.inp"))).unwrap();
    let outputs = std::fs::read_to_string(data(&format!("{vocab}.out"))).unwrap();
    let cases: Vec<&str> = inputs.split("\n__ggml_vocab_test__\n").collect();
    let expected: Vec<Vec<u32>> = outputs
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    // The input file ends with a separator line, so the last piece is empty and has no ids.
    let cases = &cases[..expected.len()];
    let mut wrong = Vec::new();
    for (text, want) in cases.iter().zip(&expected) {
        let got = tok.encode(text, false);
        if &got != want {
            wrong.push(format!("{text:?}: got {got:?}, llama.cpp {want:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{name}: {} of {} cases differ:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}

#[test]
fn starcoder_cases_encode_as_llama_cpp_encodes_them() {
    cases_encode_as_llama_cpp_encodes_them("starcoder");
}

#[test]
fn deepseek_coder_cases_encode_as_llama_cpp_encodes_them() {
    cases_encode_as_llama_cpp_encodes_them("deepseek-coder");
}

#[test]
fn falcon_cases_encode_as_llama_cpp_encodes_them() {
    cases_encode_as_llama_cpp_encodes_them("falcon");
}

#[test]
fn an_unknown_pre_tokenizer_is_refused_naming_the_supported_ones() {
    let file = GgufFile::open(data("ggml-vocab-starcoder.gguf")).expect("the vocabulary opens");
    let edited = common::rebuild_gguf(
        &file,
        &common::Edits {
            metadata: vec![(
                "tokenizer.ggml.pre".to_string(),
                Some(Value::String("no-such-pre".into())),
            )],
            ..Default::default()
        },
    );
    let e = Tokenizer::from_gguf(&edited)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("no-such-pre") && e.contains("smollm"), "{e}");
}

#[test]
fn the_formats_doc_lists_every_known_pre_tokenizer() {
    let doc = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/formats.md"),
    )
    .unwrap();
    let listed = doc
        .split("<!-- pre-tokenizers:begin -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- pre-tokenizers:end -->").next())
        .expect("docs/formats.md has the pre-tokenizer list between its markers");
    let listed: Vec<&str> = listed
        .split(',')
        .map(|n| n.trim().trim_matches('`'))
        .filter(|n| !n.is_empty())
        .collect();
    assert_eq!(listed, decode::tokenizer::supported_pre_tokenizers());
}
