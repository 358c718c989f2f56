//! Crafted GGUF files: tiny synthetic models with one metadata count changed. Each must load to
//! a clear error naming the key, its value and what the tensors say, never a panic or an
//! allocation abort (which would kill this test binary). Likewise a tensor stored as a type
//! decode cannot read.

mod common;

use common::{preset_file, rebuild_gguf, Edits};
use decode::backend::cpu::CpuBackend;
use decode::backend::Precision;
use decode::context::ContextOptions;
use decode::gguf_loader::synth::Preset;
use decode::gguf_loader::writer::Value;
use decode::gguf_loader::GgmlType;
use decode::session::Session;
use decode::DecodeError;
use std::sync::Arc;

fn load(
    preset: Preset,
    edits: &[(&str, Value)],
    options: ContextOptions,
) -> Result<(), DecodeError> {
    let file = rebuild_gguf(
        &preset_file(preset),
        &Edits {
            metadata: edits
                .iter()
                .map(|(k, v)| (k.to_string(), Some(v.clone())))
                .collect(),
            ..Default::default()
        },
    );
    Session::load(&Arc::new(file), CpuBackend::new(Precision::Fast), options).map(drop)
}

fn small() -> ContextOptions {
    ContextOptions {
        context: 32,
        max_batch: 4,
        all_logits: false,
        sequences: 1,
        kv_blocks: None,
    }
}

/// Loads with one edit and returns the error message, checking it names `key` and `value`.
fn refused(preset: Preset, key: &str, value: Value, shown: &str, says: &str) -> String {
    let e = load(preset, &[(key, value)], small()).expect_err("the crafted model must be refused");
    let msg = e.to_string();
    assert!(
        matches!(e, DecodeError::Inconsistent { .. }),
        "{key}: {msg}"
    );
    assert!(msg.contains(key), "names the key {key}: {msg}");
    assert!(msg.contains(shown), "shows the value {shown}: {msg}");
    assert!(
        msg.contains(says),
        "says what the tensors hold ({says}): {msg}"
    );
    msg
}

#[test]
fn the_unedited_models_load() {
    for preset in decode::selftest::tiny_presets() {
        load(preset, &[], small()).unwrap();
    }
}

#[test]
fn a_tensor_of_a_type_decode_cannot_read_is_refused_naming_the_type_and_the_supported_ones() {
    // A vector and a matrix, in a type gguf-loader reads and the kernels do not (MXFP4) and in
    // one it does not even dequantize (Q8_K, an activation format).
    for (tensor, ty) in [
        ("output_norm.weight", GgmlType::Mxfp4),
        ("blk.1.ffn_down.weight", GgmlType::Q8K),
    ] {
        let file = rebuild_gguf(
            &preset_file(Preset::TinyLlama),
            &Edits {
                retype: vec![(tensor.to_string(), ty)],
                ..Default::default()
            },
        );
        let e = Session::load(&Arc::new(file), CpuBackend::new(Precision::Fast), small())
            .map(drop)
            .expect_err("the model must be refused");
        let msg = e.to_string();
        assert!(
            matches!(e, DecodeError::UnsupportedTensorType { .. }),
            "{msg}"
        );
        assert!(msg.contains(tensor) && msg.contains(ty.name()), "{msg}");
        assert!(msg.contains(&decode::quant::supported_names()), "{msg}");
    }
}

#[test]
fn a_huge_block_count_is_refused_before_anything_is_sized_by_it() {
    refused(
        Preset::TinyGemma3,
        "gemma3.block_count",
        Value::U64(1 << 40),
        "1099511627776",
        "tensors for 6 layers (blk.0 to blk.5)",
    );
    // One too many and one too few are wrong as well.
    refused(
        Preset::TinyQwen3,
        "qwen3.block_count",
        Value::U32(3),
        "= 3",
        "2 layers",
    );
    refused(
        Preset::TinyQwen3,
        "qwen3.block_count",
        Value::U32(1),
        "= 1",
        "2 layers",
    );
}

#[test]
fn head_counts_whose_product_overflows_are_refused() {
    // tiny-gemma3 has one KV head, so any head count passes the divisibility check.
    refused(
        Preset::TinyGemma3,
        "gemma3.attention.head_count",
        Value::U64(1 << 62),
        "4611686018427387904",
        "overflows",
    );
    refused(
        Preset::TinyGemma3,
        "gemma3.attention.key_length",
        Value::U64(1 << 62),
        "4611686018427387904",
        "blk.0.attn_q_norm.weight normalizes heads of 128",
    );
}

#[test]
fn head_counts_that_disagree_with_the_projection_shapes_are_refused() {
    // tiny-qwen3: 4 heads and 2 KV heads of 64.
    refused(
        Preset::TinyQwen3,
        "qwen3.attention.head_count",
        Value::U32(8),
        "= 8",
        "blk.0.attn_q.weight has 256 outputs, not 512",
    );
    refused(
        Preset::TinyQwen3,
        "qwen3.attention.head_count_kv",
        Value::U32(4),
        "= 4",
        "blk.0.attn_k.weight has 128 outputs",
    );
    refused(
        Preset::TinyQwen3,
        "qwen3.attention.value_length",
        Value::U32(32),
        "= 32",
        "blk.0.attn_v.weight has 128 outputs",
    );
    refused(
        Preset::TinyQwen3,
        "qwen3.attention.key_length",
        Value::U32(32),
        "= 32",
        "heads of 64",
    );
}

#[test]
fn embedding_vocabulary_and_ffn_sizes_must_match_their_tensors() {
    refused(
        Preset::TinyQwen3,
        "qwen3.embedding_length",
        Value::U32(512),
        "= 512",
        "token_embd.weight has rows of 256",
    );
    refused(
        Preset::TinyLlama,
        "llama.vocab_size",
        Value::U64(1 << 40),
        "1099511627776",
        "512 rows, one per token",
    );
    refused(
        Preset::TinyQwen3,
        "qwen3.feed_forward_length",
        Value::U64(1 << 40),
        "1099511627776",
        "blk.0.ffn_gate.weight has 512 outputs",
    );
    refused(
        Preset::TinyQwen3Moe,
        "qwen3moe.expert_count",
        Value::U64(1 << 40),
        "1099511627776",
        "stacks 8 experts",
    );
    refused(
        Preset::TinyQwen3Moe,
        "qwen3moe.expert_feed_forward_length",
        Value::U32(1 << 20),
        "1048576",
        "256 outputs per expert",
    );
}

#[test]
fn counts_that_size_nothing_in_a_model_do_not_abort_it() {
    // A MoE model has no dense FFN, so feed_forward_length sizes nothing there.
    load(
        Preset::TinyQwen3Moe,
        &[("qwen3moe.feed_forward_length", Value::U64(1 << 40))],
        small(),
    )
    .unwrap();
    // A sliding window past any context is capped by the context.
    load(
        Preset::TinyGemma3,
        &[("gemma3.attention.sliding_window", Value::U64(u64::MAX))],
        small(),
    )
    .unwrap();
}

#[test]
fn a_context_whose_cache_size_overflows_is_an_allocation_error() {
    let e = load(
        Preset::TinyQwen3,
        &[("qwen3.context_length", Value::U64(1 << 62))],
        ContextOptions {
            context: 1 << 62,
            ..small()
        },
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, DecodeError::Allocation { .. }), "{msg}");
    assert!(msg.contains("KV cache"), "{msg}");
    assert!(msg.contains("--ctx"), "{msg}");
}

/// The fuzz targets' harnesses on their seeds (every tiny preset loads and tokenizes) and on
/// damaged copies (cut short, bytes flipped across the header), which must not panic.
#[test]
fn the_fuzz_harnesses_take_the_seeds_and_survive_damaged_copies() {
    for preset in [
        Preset::TinyGemma3,
        Preset::TinyQwen3,
        Preset::TinyQwen3Moe,
        Preset::TinyLlama,
    ] {
        let path = common::scratch_dir().join(format!(
            "fuzz-seed-{}-{}.gguf",
            preset.name(),
            std::process::id()
        ));
        decode::gguf_loader::synth::write_preset(preset, &path, 2).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert!(decode::fuzzing::load_model(&bytes), "{}", preset.name());
        assert!(
            decode::fuzzing::build_tokenizer(&bytes),
            "{}",
            preset.name()
        );
        for cut in [8, 100, 4096, bytes.len() / 2, bytes.len() - 1] {
            decode::fuzzing::load_model(&bytes[..cut]);
            decode::fuzzing::build_tokenizer(&bytes[..cut]);
        }
        let mut flipped = bytes.clone();
        for at in (24..flipped.len().min(40_000)).step_by(997) {
            flipped[at] ^= 0xff;
            decode::fuzzing::load_model(&flipped);
            decode::fuzzing::build_tokenizer(&flipped);
        }
    }
}
