//! Tokenizer settings a GGUF file may leave out, and which tokens end generation: the tiny
//! synthetic Gemma 3 vocabulary (SentencePiece, `llama`) with its metadata edited.

mod common;

use common::{preset_file, rebuild_gguf, rebuild_gguf_bytes, Edits};
use decode::gguf_loader::synth::Preset;
use decode::gguf_loader::writer::Value;
use decode::gguf_loader::GgufFile;
use decode::tokenizer::Tokenizer;

fn edited(edits: Vec<(&str, Option<Value>)>) -> GgufFile {
    rebuild_gguf(
        &preset_file(Preset::TinyGemma3),
        &Edits {
            metadata: edits.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            ..Default::default()
        },
    )
}

fn id(t: &Tokenizer, text: &str) -> u32 {
    t.vocab().tokens.iter().position(|x| x == text).unwrap() as u32
}

#[test]
fn without_the_add_space_prefix_key_a_sentencepiece_vocabulary_prepends_a_space() {
    let file = edited(vec![("tokenizer.ggml.add_space_prefix", None)]);
    let t = Tokenizer::from_gguf(&file).unwrap();
    assert!(t.vocab().add_space_prefix);
    // "hello" encodes as " hello" does without the prefix; decoding strips it again.
    let no_prefix = Tokenizer::from_gguf(&preset_file(Preset::TinyGemma3)).unwrap();
    assert!(!no_prefix.vocab().add_space_prefix);
    assert_eq!(t.encode("hello", false), no_prefix.encode(" hello", false));
    assert_ne!(t.encode("hello", false), no_prefix.encode("hello", false));
    for text in ["hello world", "  two spaces", "x"] {
        assert_eq!(t.decode(&t.encode(text, false)), text);
    }

    // The independent reference (sentencepiece's convention) agrees.
    let Some(()) = common::python_ready() else {
        return;
    };
    let path = common::scratch_dir().join(format!("no-space-prefix-{}.gguf", std::process::id()));
    let bytes = rebuild_gguf_bytes(
        &preset_file(Preset::TinyGemma3),
        &Edits {
            metadata: vec![("tokenizer.ggml.add_space_prefix".into(), None)],
            ..Default::default()
        },
    );
    std::fs::write(&path, bytes).unwrap();
    for text in ["hello world", "The quick fox, 42!"] {
        assert_eq!(
            t.encode(text, false),
            common::reference_tokenize(&path, text),
            "{text:?}"
        );
    }
    std::fs::remove_file(&path).ok();
}

#[test]
fn a_gpt2_vocabulary_without_the_key_prepends_nothing() {
    let t = Tokenizer::from_gguf(&preset_file(Preset::TinyQwen3)).unwrap();
    assert!(!t.vocab().add_space_prefix);
}

#[test]
fn gemma_stops_at_its_control_end_of_turn_token() {
    let t = Tokenizer::from_gguf(&preset_file(Preset::TinyGemma3)).unwrap();
    let eot = id(&t, "<end_of_turn>");
    assert!(t.is_stop(eot));
    assert!(t.is_stop(id(&t, "<eos>")));
    assert!(!t.is_stop(id(&t, "<start_of_turn>")));
    assert!(!t.is_stop(id(&t, "<bos>")));
}

#[test]
fn an_end_of_turn_text_typed_as_normal_is_an_ordinary_token() {
    // The same vocabulary with <end_of_turn> typed NORMAL, as in a non-Gemma vocabulary where
    // it is just text.
    let base = preset_file(Preset::TinyGemma3);
    let eot = Tokenizer::from_gguf(&base)
        .map(|t| id(&t, "<end_of_turn>"))
        .unwrap();
    let mut types = base.get_i32_array("tokenizer.ggml.token_type").unwrap();
    types[eot as usize] = 1;
    let file = edited(vec![(
        "tokenizer.ggml.token_type",
        Some(Value::i32s(types.clone())),
    )]);
    let t = Tokenizer::from_gguf(&file).unwrap();
    assert!(!t.is_stop(eot), "stops: {:?}", t.stop_ids());
    assert_eq!(t.stop_ids(), [id(&t, "<eos>")]);
    // Written in text it is not matched whole either.
    assert_ne!(t.encode("<end_of_turn>", false), vec![eot]);

    // Named by tokenizer.ggml.eot_token_id, it stops whatever its type.
    let file = edited(vec![
        ("tokenizer.ggml.token_type", Some(Value::i32s(types))),
        ("tokenizer.ggml.eot_token_id", Some(Value::U32(eot))),
    ]);
    let t = Tokenizer::from_gguf(&file).unwrap();
    assert!(t.is_stop(eot));
}

#[test]
fn an_eot_id_outside_the_vocabulary_is_an_error() {
    let file = edited(vec![(
        "tokenizer.ggml.eot_token_id",
        Some(Value::U32(1_000_000)),
    )]);
    let e = Tokenizer::from_gguf(&file).err().unwrap().to_string();
    assert!(e.contains("eot_token_id 1000000"), "{e}");
}
