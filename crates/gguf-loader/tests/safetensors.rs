//! safetensors checkpoints: f32/f16/bf16 read through memmap2 and the safetensors crate, the
//! architecture from config.json, and clear errors for what is missing or broken.

use gguf_loader::safetensors_file::SafetensorsModel;
use gguf_loader::{Architecture, GgufError};
use half::{bf16, f16};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::PathBuf;

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gguf-loader-st-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_checkpoint(dir: &std::path::Path, config: &str) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let a: Vec<f32> = (0..6).map(|i| i as f32 * 0.25 - 1.0).collect();
    let b: Vec<f32> = vec![1.5, -2.0, 65504.0, 0.000_061_035_156];
    let c: Vec<f32> = vec![3.0, -0.5, 1e30];
    let a_bytes: Vec<u8> = a.iter().flat_map(|v| v.to_le_bytes()).collect();
    let b_bytes: Vec<u8> = b
        .iter()
        .flat_map(|v| f16::from_f32(*v).to_le_bytes())
        .collect();
    let c_bytes: Vec<u8> = c
        .iter()
        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
        .collect();
    let tensors = vec![
        (
            "model.a",
            TensorView::new(Dtype::F32, vec![2, 3], &a_bytes).unwrap(),
        ),
        (
            "model.b",
            TensorView::new(Dtype::F16, vec![4], &b_bytes).unwrap(),
        ),
        (
            "model.c",
            TensorView::new(Dtype::BF16, vec![3, 1], &c_bytes).unwrap(),
        ),
    ];
    safetensors::serialize_to_file(tensors, None, &dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("config.json"), config).unwrap();
    let c_rounded = c.iter().map(|v| bf16::from_f32(*v).to_f32()).collect();
    (a, b, c_rounded)
}

#[test]
fn reads_f32_f16_bf16_and_the_architecture() {
    let dir = temp_dir("ok");
    let (a, b, c) = write_checkpoint(&dir, r#"{"model_type": "qwen3", "hidden_size": 8}"#);
    for path in [dir.clone(), dir.join("model.safetensors")] {
        let m = SafetensorsModel::open(&path).unwrap();
        assert_eq!(m.architecture, Architecture::Qwen3);
        assert_eq!(m.config["hidden_size"], 8);
        assert_eq!(m.tensors().len(), 3);
        let ta = m.tensor("model.a").unwrap();
        assert_eq!(ta.shape, vec![2, 3]);
        assert_eq!(m.dequantize_tensor(ta).unwrap(), a);
        assert_eq!(
            m.dequantize_tensor(m.tensor("model.b").unwrap()).unwrap(),
            b
        );
        assert_eq!(
            m.dequantize_tensor(m.tensor("model.c").unwrap()).unwrap(),
            c
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn architecture_comes_from_architectures_when_model_type_is_absent() {
    let dir = temp_dir("archs");
    write_checkpoint(&dir, r#"{"architectures": ["Gemma3ForCausalLM"]}"#);
    assert_eq!(
        SafetensorsModel::open(&dir).unwrap().architecture,
        Architecture::Gemma3
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn missing_config_unknown_architecture_and_truncation_are_errors() {
    let dir = temp_dir("bad");
    write_checkpoint(&dir, r#"{"model_type": "mamba"}"#);
    let e = SafetensorsModel::open(&dir).unwrap_err();
    assert!(
        matches!(e, GgufError::UnsupportedArchitecture { .. }) && e.to_string().contains("mamba"),
        "{e}"
    );

    std::fs::remove_file(dir.join("config.json")).unwrap();
    let e = SafetensorsModel::open(&dir).unwrap_err();
    assert!(e.to_string().contains("config.json"), "{e}");

    std::fs::write(dir.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    let file = dir.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    for cut in [0, 5, 8, 20, bytes.len() - 1] {
        std::fs::write(&file, &bytes[..cut]).unwrap();
        let e = SafetensorsModel::open(&dir).unwrap_err();
        assert!(matches!(e, GgufError::Safetensors { .. }), "cut {cut}: {e}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
