//! Tiny synthetic presets: they write quickly, load here and in gguf-py, describe themselves
//! consistently, and dequantize identically to gguf-py.

mod common;

use common::{gguf_py_available, run_reference, sha256_f32_le};
use gguf_loader::synth::{preset_bytes, write_preset, Preset};
use gguf_loader::{Architecture, GgufFile, ModelConfig};

fn tiny_presets() -> Vec<Preset> {
    Preset::ALL.into_iter().filter(|p| p.is_tiny()).collect()
}

fn write(preset: Preset, seed: u64) -> (std::path::PathBuf, GgufFile) {
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let unique = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!(
        "gguf-loader-synth-{}-{seed}-{}-{unique}.gguf",
        preset.name(),
        std::process::id()
    ));
    write_preset(preset, &path, seed).unwrap();
    let f = GgufFile::open(&path).unwrap();
    (path, f)
}

#[test]
fn tiny_presets_are_consistent_models() {
    for preset in tiny_presets() {
        let (path, f) = write(preset, 3);
        let spec = preset.spec();
        let c = ModelConfig::from_gguf(&f).unwrap();
        assert_eq!(c.architecture, spec.arch, "{}", preset.name());
        assert_eq!(
            (c.n_layers, c.n_embd, c.n_ff),
            (spec.n_layers, spec.n_embd, spec.n_ff)
        );
        assert_eq!(
            (c.n_head, c.n_head_kv, c.head_dim_k),
            (spec.n_head, spec.n_head_kv, spec.head_dim)
        );
        assert_eq!(c.vocab_size, spec.vocab);
        assert_eq!(c.n_expert, spec.n_expert);
        // Shapes agree with the description, in GGML order.
        let embd = f.require_tensor("token_embd.weight").unwrap();
        assert_eq!(embd.dims, vec![c.n_embd as u64, c.vocab_size as u64]);
        let q = f.require_tensor("blk.0.attn_q.weight").unwrap();
        assert_eq!(
            q.dims,
            vec![c.n_embd as u64, (c.n_head * c.head_dim_k) as u64]
        );
        let last = c.n_layers - 1;
        assert!(f.tensor(&format!("blk.{last}.attn_norm.weight")).is_some());
        assert!(f
            .tensor(&format!("blk.{}.attn_norm.weight", c.n_layers))
            .is_none());
        if c.architecture == Architecture::Qwen3Moe {
            let gate = f.require_tensor("blk.0.ffn_gate_exps.weight").unwrap();
            assert_eq!(
                gate.dims,
                vec![
                    c.n_embd as u64,
                    c.n_ff_expert.unwrap() as u64,
                    c.n_expert as u64
                ]
            );
        }
        // A tokenizer that can be used: tokens match the vocabulary, bos/eos inside it.
        let tokens = f.get_str_slice("tokenizer.ggml.tokens").unwrap();
        assert_eq!(tokens.len(), c.vocab_size);
        assert_eq!(
            f.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
            c.vocab_size
        );
        assert!((f.get_u32("tokenizer.ggml.bos_token_id").unwrap() as usize) < c.vocab_size);
        assert!((f.get_u32("tokenizer.ggml.eos_token_id").unwrap() as usize) < c.vocab_size);
        match f.get_str("tokenizer.ggml.model").unwrap() {
            "gpt2" => {
                let merges = f.get_str_slice("tokenizer.ggml.merges").unwrap();
                let vocab: std::collections::HashSet<&str> = tokens.iter().copied().collect();
                for m in merges {
                    let (a, b) = m.split_once(' ').unwrap();
                    assert!(
                        vocab.contains(a)
                            && vocab.contains(b)
                            && vocab.contains(format!("{a}{b}").as_str())
                    );
                }
            }
            "llama" => assert_eq!(
                f.get_f32_array("tokenizer.ggml.scores").unwrap().len(),
                c.vocab_size
            ),
            other => panic!("unexpected tokenizer {other}"),
        }
        // Every weight is finite.
        for t in f.tensors() {
            let values = f.dequantize_tensor(t).unwrap();
            assert!(
                values.iter().all(|v| v.is_finite()),
                "{} in {}",
                t.name,
                preset.name()
            );
        }
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn tiny_presets_depend_on_the_seed_only() {
    let (p1, a) = write(Preset::TinyLlama, 11);
    let (p2, b) = write(Preset::TinyLlama, 11);
    let (p3, c) = write(Preset::TinyLlama, 12);
    let t = a.require_tensor("blk.1.ffn_down.weight").unwrap();
    assert_eq!(a.tensor_data(t), b.tensor_data(t));
    assert_ne!(a.tensor_data(t), c.tensor_data(t));
    for p in [p1, p2, p3] {
        std::fs::remove_file(p).unwrap();
    }
}

#[test]
fn a_preset_made_in_memory_is_the_file_written_to_disk_byte_for_byte() {
    for preset in tiny_presets() {
        let (path, _) = write(preset, 11);
        let on_disk = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let in_memory = preset_bytes(preset, 11).unwrap();
        assert_eq!(in_memory.len(), on_disk.len(), "{}", preset.name());
        assert!(in_memory == on_disk, "{}: the bytes differ", preset.name());
    }
}

/// gguf-py reads every tiny preset and dequantizes every tensor exactly as we do.
#[test]
fn tiny_presets_load_in_gguf_py_and_match_it() {
    let test = "tiny_presets_load_in_gguf_py_and_match_it";
    if !gguf_py_available(test) {
        return;
    }
    for preset in tiny_presets() {
        let (path, f) = write(preset, 5);
        let reference = run_reference("gguf_dequant_hashes.py", &[path.as_os_str()]);
        assert_eq!(
            reference.lines().count(),
            f.tensors().len(),
            "{}",
            preset.name()
        );
        for line in reference.lines() {
            let fields: Vec<&str> = line.split('\t').collect();
            let t = f.file_tensor(fields[0]).unwrap();
            assert_eq!(t.ggml_type.name(), fields[1]);
            let ours = sha256_f32_le(&f.dequantize_tensor(t).unwrap());
            assert_eq!(ours, fields[3], "{} in {}", t.name, preset.name());
        }
        std::fs::remove_file(path).unwrap();
    }
}

/// `.npy` files of dequantized tensors load in numpy with gguf-py's shape and values.
#[test]
fn npy_export_loads_in_numpy_and_matches_gguf_py() {
    let test = "npy_export_loads_in_numpy_and_matches_gguf_py";
    if !gguf_py_available(test) {
        return;
    }
    let (path, f) = write(Preset::TinyGemma3, 8);
    for name in [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.1.ffn_down.weight",
        "output_norm.weight",
    ] {
        let npy = path.with_extension(format!("{name}.npy"));
        gguf_loader::inspect::write_tensor_npy(&f, name, &npy).unwrap();
        let out = run_reference(
            "gguf_npy_check.py",
            &[path.as_os_str(), name.as_ref(), npy.as_os_str()],
        );
        assert!(out.starts_with("ok "), "{out}");
        std::fs::remove_file(npy).unwrap();
    }
    std::fs::remove_file(path).unwrap();
}

/// The text and JSON reports describe the file: every tensor and key appears, long arrays are
/// elided, and the JSON model description equals ModelConfig.
#[test]
fn inspect_reports_describe_the_file() {
    let (path, f) = write(Preset::TinyQwen3Moe, 2);
    let mut text = Vec::new();
    gguf_loader::inspect::write_text_report(&f, &mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    for t in f.tensors() {
        assert!(text.contains(&t.name), "{}", t.name);
    }
    for (key, _) in f.metadata() {
        assert!(text.contains(key), "{key}");
    }
    assert!(text.contains("more)"), "long arrays are elided");
    assert!(text.lines().count() < 200, "the vocabulary is not printed");

    let json = gguf_loader::inspect::json_report(&f);
    assert_eq!(json["tensors"].as_array().unwrap().len(), f.tensors().len());
    assert_eq!(json["metadata"]["tokenizer.ggml.tokens"]["len"], 640);
    let config = ModelConfig::from_gguf(&f).unwrap();
    assert_eq!(json["model"], serde_json::to_value(&config).unwrap());
    assert_eq!(json["model"]["n_expert"], 8);
    std::fs::remove_file(path).unwrap();
}
