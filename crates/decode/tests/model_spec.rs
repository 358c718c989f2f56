//! ModelSpec's per-layer attention settings are gguf-loader's ModelConfig answers: which layers
//! slide, their window and every layer's RoPE base come from `window_for_layer` and
//! `rope_base_for_layer`, for every architecture, with or without sliding-window keys.

mod common;

use common::{preset_file, rebuild_gguf, Edits};
use decode::gguf_loader::synth::Preset;
use decode::gguf_loader::writer::Value;
use decode::gguf_loader::{GgufFile, ModelConfig};
use decode::model::ModelSpec;
use test_support::models::gemma_path;

/// `preset` with the metadata `edits` (keys without the architecture prefix) and `layers`
/// layers (tensors repeated when more than the preset has).
fn edited(preset: Preset, edits: &[(&str, Value)], layers: Option<usize>) -> GgufFile {
    let arch = preset.spec().arch.name();
    rebuild_gguf(
        &preset_file(preset),
        &Edits {
            metadata: edits
                .iter()
                .map(|(k, v)| (format!("{arch}.{k}"), Some(v.clone())))
                .collect(),
            layers,
            ..Default::default()
        },
    )
}

/// Asserts the spec's layers are exactly the config's per-layer answers; returns the spec.
fn spec_matches_config(file: &GgufFile, what: &str) -> (ModelSpec, ModelConfig) {
    let spec = ModelSpec::from_gguf(file).unwrap_or_else(|e| panic!("{what}: {e}"));
    let c = ModelConfig::from_gguf(file).unwrap();
    assert_eq!(spec.layers.len(), c.n_layers, "{what}");
    for (il, l) in spec.layers.iter().enumerate() {
        assert_eq!(l.window, c.window_for_layer(il), "{what} layer {il} window");
        assert_eq!(
            l.rope.freq_base,
            c.rope_base_for_layer(il),
            "{what} layer {il} RoPE base"
        );
    }
    (spec, c)
}

fn global_layers(spec: &ModelSpec) -> Vec<usize> {
    (0..spec.n_layers)
        .filter(|&il| spec.layers[il].window.is_none())
        .collect()
}

#[test]
fn non_gemma_files_with_a_sliding_window_get_model_configs_layers() {
    let window = [
        ("attention.sliding_window", Value::U32(16)),
        ("attention.sliding_window_pattern", Value::U32(2)),
        ("rope.freq_base_swa", Value::F32(5000.0)),
    ];
    for preset in [Preset::TinyLlama, Preset::TinyQwen3, Preset::TinyQwen3Moe] {
        // The window alone, and with a pattern and a local base.
        for edits in [&window[..1], &window[..]] {
            let what = format!("{} with {} window keys", preset.name(), edits.len());
            let (spec, c) = spec_matches_config(&edited(preset, edits, None), &what);
            // The rule: these architectures attend globally on every layer, at the file's base.
            assert_eq!(global_layers(&spec), [0, 1], "{what}");
            assert!(
                spec.layers
                    .iter()
                    .all(|l| l.rope.freq_base == c.rope_freq_base),
                "{what}"
            );
        }
    }
}

#[test]
fn gemma_like_metadata_with_18_layers_has_global_layers_5_11_17() {
    // tiny-gemma3 (window 8, base 1e6) grown to the real 270M's 18 layers, without a pattern key
    // as in the real file, then with the pattern stated.
    let depth = ("block_count", Value::U32(18));
    let pattern = ("attention.sliding_window_pattern", Value::U32(6));
    for edits in [vec![depth.clone()], vec![depth, pattern]] {
        let what = format!("tiny-gemma3, 18 layers, {} edits", edits.len());
        let (spec, c) = spec_matches_config(&edited(Preset::TinyGemma3, &edits, Some(18)), &what);
        assert_eq!(global_layers(&spec), [5, 11, 17], "{what}");
        for (il, l) in spec.layers.iter().enumerate() {
            let global = il % 6 == 5;
            assert_eq!(l.window, (!global).then_some(8), "{what} layer {il}");
            let base = if global { c.rope_freq_base } else { 10_000.0 };
            assert_eq!(l.rope.freq_base, base, "{what} layer {il}");
        }
        assert_eq!(c.rope_freq_base, 1_000_000.0);
    }
}

#[test]
fn real_gemma_has_global_layers_5_11_17() {
    let Some(path) = gemma_path() else { return };
    let file = decode::open_model(&path).unwrap();
    let (spec, _) = spec_matches_config(&file, "gemma3-270m");
    assert_eq!(global_layers(&spec), [5, 11, 17]);
    assert!(spec
        .layers
        .iter()
        .all(|l| l.window.is_none_or(|w| w == 512)));
}

/// Phi-3's 128k files (LongRoPE factor tensors) load: a context longer than the original one
/// turns by the long factors, a shorter one by the short, and the attention factor scales the
/// scores by its square. With only part of each head rotated, that scale would be wrong, and
/// such a file is refused naming the key.
#[test]
fn phi3_longrope_picks_factors_by_context_and_scales_attention() {
    let file = preset_file(Preset::TinyPhi3LongRope);
    let spec = ModelSpec::from_gguf(&file).expect("LongRoPE Phi-3 loads");
    let long = spec.long_rope.expect("the LongRoPE tensors are seen");
    assert_eq!(long.original_context, 48);
    assert!(
        !long.is_long(48),
        "as many positions as the original context: short"
    );
    assert!(long.is_long(49));
    let plain = ModelSpec::from_gguf(&preset_file(Preset::TinyPhi3)).expect("4k Phi-3 loads");
    assert!(plain.long_rope.is_none());
    assert!(plain
        .layers
        .iter()
        .all(|l| l.rope.neox && l.window.is_none()));
    let ratio = spec.attn_scale / plain.attn_scale;
    let want = long.attn_factor * long.attn_factor;
    assert!(
        (ratio - want).abs() < 1e-6,
        "scale ratio {ratio}, want {want}"
    );

    let half = Preset::TinyPhi3LongRope.spec().head_dim as u32 / 2;
    let partial = edited(
        Preset::TinyPhi3LongRope,
        &[("rope.dimension_count", Value::U32(half))],
        None,
    );
    let err = ModelSpec::from_gguf(&partial)
        .expect_err("a partly rotated head cannot take the factor as a scale")
        .to_string();
    assert!(err.contains("phi3.rope.scaling.attn_factor"), "{err}");
}
