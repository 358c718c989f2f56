//! ModelConfig from metadata: every family, scaling variants, and errors that name the key.

use gguf_loader::writer::Value;
use gguf_loader::{Architecture, GgufError, GgufFile, GgufWriter, ModelConfig, RopeScaling};

fn file(arch: &str, extra: &[(&str, Value)], skip: &[&str]) -> GgufFile {
    let mut w = GgufWriter::new();
    w.add("general.architecture", arch).unwrap();
    let k = |s: &str| format!("{arch}.{s}");
    let base = [
        ("block_count", Value::U32(4)),
        ("embedding_length", Value::U32(512)),
        ("feed_forward_length", Value::U32(1024)),
        ("attention.head_count", Value::U32(8)),
        ("attention.head_count_kv", Value::U32(2)),
        ("rope.freq_base", Value::F32(10000.0)),
        ("attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
        ("context_length", Value::U32(4096)),
        ("vocab_size", Value::U64(1000)),
    ];
    for (suffix, v) in base {
        if !skip.contains(&suffix) {
            w.add(k(suffix), v).unwrap();
        }
    }
    for (suffix, v) in extra {
        w.add(k(suffix), v.clone()).unwrap();
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

#[test]
fn qwen2_derives_the_head_dim_and_has_no_window_or_experts() {
    let c = ModelConfig::from_gguf(&file("qwen2", &[], &[])).unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert_eq!((c.head_dim_k, c.head_dim_v), (64, 64));
    assert_eq!(
        (c.n_expert, c.n_expert_used, c.sliding_window),
        (0, 0, None)
    );
    assert_eq!(c.vocab_size, 1000);
    assert!(!c.is_sliding_layer(3));
}

#[test]
fn rope_scaling_variants() {
    let linear = file(
        "llama",
        &[
            ("rope.scaling.type", "linear".into()),
            ("rope.scaling.factor", Value::F32(8.0)),
        ],
        &[],
    );
    assert_eq!(
        ModelConfig::from_gguf(&linear).unwrap().rope_scaling,
        Some(RopeScaling::Linear { factor: 8.0 })
    );
    let yarn = file(
        "qwen3",
        &[
            ("rope.scaling.type", "yarn".into()),
            ("rope.scaling.factor", Value::F32(4.0)),
            ("rope.scaling.original_context_length", Value::U32(32768)),
        ],
        &[],
    );
    assert_eq!(
        ModelConfig::from_gguf(&yarn).unwrap().rope_scaling,
        Some(RopeScaling::Yarn {
            factor: 4.0,
            original_context_length: 32768
        })
    );
    let missing_factor = file("llama", &[("rope.scaling.type", "yarn".into())], &[]);
    let e = ModelConfig::from_gguf(&missing_factor).unwrap_err();
    assert!(
        matches!(e, GgufError::MissingKey { ref key } if key == "llama.rope.scaling.factor"),
        "{e}"
    );
    let unknown = file("llama", &[("rope.scaling.type", "longrope".into())], &[]);
    assert!(ModelConfig::from_gguf(&unknown)
        .unwrap_err()
        .to_string()
        .contains("longrope"));
}

/// Phi-3's 128k files: two factor tensors, the original context and the attention factor.
#[test]
fn phi3_longrope_is_read_from_its_factor_tensors() {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "phi3").unwrap();
    for (key, v) in [
        ("block_count", Value::U32(2)),
        ("embedding_length", Value::U32(256)),
        ("feed_forward_length", Value::U32(512)),
        ("attention.head_count", Value::U32(4)),
        ("attention.head_count_kv", Value::U32(4)),
        ("rope.freq_base", Value::F32(10000.0)),
        ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("context_length", Value::U32(131_072)),
        ("vocab_size", Value::U32(1000)),
        ("rope.scaling.original_context_length", Value::U32(4096)),
        ("rope.scaling.attn_factor", Value::F32(1.19)),
        ("rope.scaling.type", "longrope".into()),
    ] {
        w.add(format!("phi3.{key}"), v).unwrap();
    }
    let factors = |v: f32| (0..32).flat_map(|_| v.to_le_bytes()).collect::<Vec<u8>>();
    w.add_tensor(
        "rope_factors_long.weight",
        &[32],
        gguf_loader::GgmlType::F32,
        factors(4.0),
    )
    .unwrap();
    w.add_tensor(
        "rope_factors_short.weight",
        &[32],
        gguf_loader::GgmlType::F32,
        factors(1.0),
    )
    .unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let c = ModelConfig::from_gguf(&f).unwrap();
    assert_eq!(c.architecture, Architecture::Phi3);
    assert_eq!(
        c.rope_scaling,
        Some(RopeScaling::LongRope {
            original_context_length: 4096,
            attn_factor: 1.19
        })
    );
    assert_eq!(c.sliding_window, None, "llama.cpp turns Phi-3's window off");
}

#[test]
fn missing_keys_are_named_never_defaulted() {
    for (arch, skip, key) in [
        (
            "llama",
            "attention.head_count_kv",
            "llama.attention.head_count_kv",
        ),
        ("qwen3", "rope.freq_base", "qwen3.rope.freq_base"),
        (
            "llama",
            "attention.layer_norm_rms_epsilon",
            "llama.attention.layer_norm_rms_epsilon",
        ),
        ("qwen2", "context_length", "qwen2.context_length"),
    ] {
        let e = ModelConfig::from_gguf(&file(arch, &[], &[skip])).unwrap_err();
        assert!(
            matches!(e, GgufError::MissingKey { key: ref k } if k == key),
            "{arch} {skip}: {e}"
        );
    }
    // Gemma 3 needs its window; Qwen3 MoE its experts.
    let e = ModelConfig::from_gguf(&file("gemma3", &[], &[])).unwrap_err();
    assert!(
        e.to_string().contains("gemma3.attention.sliding_window"),
        "{e}"
    );
    let e = ModelConfig::from_gguf(&file("qwen3moe", &[], &[])).unwrap_err();
    assert!(e.to_string().contains("qwen3moe.expert_count"), "{e}");
    // Without vocab_size and tokens, both are named.
    let e = ModelConfig::from_gguf(&file("llama", &[], &["vocab_size"])).unwrap_err();
    assert!(
        e.to_string().contains("llama.vocab_size")
            && e.to_string().contains("tokenizer.ggml.tokens"),
        "{e}"
    );
}

#[test]
fn inconsistent_values_are_errors() {
    let e = ModelConfig::from_gguf(&file(
        "llama",
        &[("attention.head_count_kv", Value::U32(3))],
        &["attention.head_count_kv"],
    ))
    .unwrap_err();
    assert!(
        e.to_string().contains("must divide the head count 8"),
        "{e}"
    );
    let e = ModelConfig::from_gguf(&file(
        "llama",
        &[("block_count", Value::U32(0))],
        &["block_count"],
    ))
    .unwrap_err();
    assert!(
        matches!(e, GgufError::InvalidValue { ref key, .. } if key == "llama.block_count"),
        "{e}"
    );
    let moe = file(
        "qwen3moe",
        &[
            ("expert_count", Value::U32(4)),
            ("expert_used_count", Value::U32(8)),
            ("expert_feed_forward_length", Value::U32(256)),
        ],
        &[],
    );
    assert!(ModelConfig::from_gguf(&moe)
        .unwrap_err()
        .to_string()
        .contains("exceeds the expert count 4"));
    let e = ModelConfig::from_gguf(&file("mamba", &[], &[])).unwrap_err();
    assert!(
        matches!(e, GgufError::UnsupportedArchitecture { ref name, .. } if name == "mamba"),
        "{e}"
    );
}

#[test]
fn gemma3_window_pattern_and_local_base_can_be_stated_by_the_file() {
    let f = file(
        "gemma3",
        &[
            ("attention.sliding_window", Value::U32(1024)),
            ("attention.sliding_window_pattern", Value::U32(4)),
            ("rope.freq_base_swa", Value::F32(5000.0)),
        ],
        &[],
    );
    let c = ModelConfig::from_gguf(&f).unwrap();
    assert_eq!(
        (c.sliding_window, c.sliding_window_pattern),
        (Some(1024), Some(4))
    );
    assert_eq!(c.rope_base_for_layer(0), 5000.0);
    assert_eq!(c.rope_base_for_layer(3), 10000.0);
}

#[test]
fn gemma3_without_a_pattern_key_has_every_sixth_layer_global() {
    // The real Gemma 3 270M's depth; its file states the window but not the pattern.
    let f = file(
        "gemma3",
        &[
            ("block_count", Value::U32(18)),
            ("rope.freq_base", Value::F32(1_000_000.0)),
            ("attention.sliding_window", Value::U32(512)),
        ],
        &["block_count", "rope.freq_base"],
    );
    let c = ModelConfig::from_gguf(&f).unwrap();
    assert_eq!(c.sliding_window_pattern, Some(6));
    let global: Vec<usize> = (0..c.n_layers)
        .filter(|&l| !c.is_sliding_layer(l))
        .collect();
    assert_eq!(global, [5, 11, 17]);
    for layer in 0..c.n_layers {
        let sliding = !global.contains(&layer);
        assert_eq!(c.window_for_layer(layer), sliding.then_some(512));
        // Local layers take Gemma 3's fixed 10 000, global ones the file's base.
        let base = if sliding { 10_000.0 } else { 1_000_000.0 };
        assert_eq!(c.rope_base_for_layer(layer), base, "layer {layer}");
    }
}

#[test]
fn gemma2_defaults_to_llama_cpps_window_pattern_and_caps_and_takes_the_files() {
    // Nothing stated: a window of 4096 on layers 0, 2, ..., the global base everywhere, and
    // caps of 50 and 30.
    let c = ModelConfig::from_gguf(&file("gemma2", &[], &[])).unwrap();
    assert_eq!(c.architecture, Architecture::Gemma2);
    let windows: Vec<Option<usize>> = (0..c.n_layers).map(|l| c.window_for_layer(l)).collect();
    assert_eq!(windows, [Some(4096), None, Some(4096), None]);
    assert!((0..c.n_layers).all(|l| c.rope_base_for_layer(l) == 10_000.0));
    assert_eq!(
        (c.attn_logit_softcap, c.final_logit_softcap),
        (Some(50.0), Some(30.0))
    );
    // The file's values win.
    let f = file(
        "gemma2",
        &[
            ("attention.sliding_window", Value::U32(64)),
            ("attention.sliding_window_pattern", Value::U32(4)),
            ("attn_logit_softcapping", Value::F32(20.0)),
            ("final_logit_softcapping", Value::F32(15.0)),
            ("rope.freq_base_swa", Value::F32(500.0)),
        ],
        &[],
    );
    let c = ModelConfig::from_gguf(&f).unwrap();
    let windows: Vec<Option<usize>> = (0..c.n_layers).map(|l| c.window_for_layer(l)).collect();
    assert_eq!(windows, [Some(64), Some(64), Some(64), None]);
    assert_eq!(c.rope_base_for_layer(0), 500.0);
    assert_eq!(c.rope_base_for_layer(3), 10_000.0);
    assert_eq!(
        (c.attn_logit_softcap, c.final_logit_softcap),
        (Some(20.0), Some(15.0))
    );
    // A cap that is not a positive number is refused by name.
    let f = file(
        "gemma2",
        &[("attn_logit_softcapping", Value::F32(0.0))],
        &[],
    );
    let e = ModelConfig::from_gguf(&f).unwrap_err().to_string();
    assert!(e.contains("gemma2.attn_logit_softcapping"), "{e}");
    // Other families have no caps.
    let c = ModelConfig::from_gguf(&file(
        "gemma3",
        &[("attention.sliding_window", Value::U32(8))],
        &[],
    ))
    .unwrap();
    assert_eq!((c.attn_logit_softcap, c.final_logit_softcap), (None, None));
}

#[test]
fn a_window_key_changes_nothing_for_architectures_without_sliding_layers() {
    let window = [
        ("attention.sliding_window", Value::U32(16)),
        ("attention.sliding_window_pattern", Value::U32(2)),
        ("rope.freq_base_swa", Value::F32(5000.0)),
    ];
    let experts = [
        ("expert_count", Value::U32(4)),
        ("expert_used_count", Value::U32(2)),
        ("expert_feed_forward_length", Value::U32(256)),
    ];
    for arch in ["llama", "qwen2", "qwen3", "qwen3moe"] {
        // The window alone, and with a pattern and a local base.
        for keys in [&window[..1], &window[..]] {
            let mut extra = keys.to_vec();
            if arch == "qwen3moe" {
                extra.extend(experts.iter().cloned());
            }
            let c = ModelConfig::from_gguf(&file(arch, &extra, &[])).unwrap();
            assert!(!c.architecture.has_sliding_window_layers());
            assert_eq!(
                (
                    c.sliding_window,
                    c.sliding_window_pattern,
                    c.rope_freq_base_local
                ),
                (None, None, None),
                "{arch}"
            );
            for layer in 0..c.n_layers {
                assert!(!c.is_sliding_layer(layer), "{arch} layer {layer}");
                assert_eq!(c.window_for_layer(layer), None, "{arch} layer {layer}");
                assert_eq!(
                    c.rope_base_for_layer(layer),
                    10000.0,
                    "{arch} layer {layer}"
                );
            }
        }
    }
}
