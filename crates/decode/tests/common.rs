//! Shared helpers of the reference tests: locating models and running the Python reference.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn require_models() -> bool {
    std::env::var("HIPDECODE_REQUIRE_MODELS").is_ok_and(|v| v == "1")
}

/// Skips (returns `None` with a printed reason) unless required, in which case it panics.
pub fn skip(reason: &str) -> Option<()> {
    assert!(!require_models(), "HIPDECODE_REQUIRE_MODELS=1 but {reason}");
    eprintln!("skipping: {reason}");
    None
}

pub fn models_dir() -> PathBuf {
    match std::env::var_os("HIPDECODE_MODELS_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => workspace_root().join("models"),
    }
}

/// The real Gemma 3 270M file, or a printed skip.
pub fn gemma_path() -> Option<PathBuf> {
    let p = models_dir().join("gemma3-270m-q4_k_m.gguf");
    if p.exists() {
        Some(p)
    } else {
        skip(&format!(
            "{} is absent; run `cargo xtask fetch-model gemma3-270m`",
            p.display()
        ))
        .map(|_| p)
    }
}

/// Whether python3 with numpy and gguf (and what the tokenizer reference needs) is usable.
pub fn python_ready() -> Option<()> {
    let ok = Command::new("python3")
        .args(["-c", "import numpy, gguf, sentencepiece, regex"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Some(())
    } else {
        skip(
            "python3 with numpy, gguf, sentencepiece and regex is not available; \
              `python3 -m pip install -r tests/reference/requirements.txt`",
        )
    }
}

fn run_python(script: &str, args: &[String]) -> String {
    let path = workspace_root().join("tests/reference").join(script);
    let out = Command::new("python3")
        .arg(&path)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{script} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn ids_arg(ids: &[u32]) -> String {
    ids.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Reference logits `[n][vocab]` at every position of `tokens`.
pub fn reference_logits(model: &Path, tokens: &[u32], scratch: &Path) -> (Vec<f32>, usize) {
    let stem = model
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let out = scratch.join(format!(
        "ref-logits-{stem}-{}-{}.npy",
        tokens.len(),
        std::process::id()
    ));
    run_python(
        "forward.py",
        &[
            "--model".into(),
            model.display().to_string(),
            "--tokens".into(),
            ids_arg(tokens),
            "--out".into(),
            out.display().to_string(),
        ],
    );
    let (shape, data) = read_npy_f32(&out);
    std::fs::remove_file(&out).ok();
    assert_eq!(shape.len(), 2);
    assert_eq!(shape[0], tokens.len());
    (data, shape[1])
}

/// The reference's greedy continuation.
pub fn reference_greedy(model: &Path, tokens: &[u32], n: usize) -> Vec<u32> {
    let out = run_python(
        "forward.py",
        &[
            "--model".into(),
            model.display().to_string(),
            "--tokens".into(),
            ids_arg(tokens),
            "--greedy".into(),
            n.to_string(),
        ],
    );
    json_ids(&out, "tokens")
}

/// The reference tokenizer's ids for `text` (no BOS).
pub fn reference_tokenize(model: &Path, text: &str) -> Vec<u32> {
    let out = run_python(
        "tokenizer_ref.py",
        &[
            "--model".into(),
            model.display().to_string(),
            "--text".into(),
            text.into(),
        ],
    );
    json_ids(&out, "ids")
}

fn json_ids(out: &str, key: &str) -> Vec<u32> {
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON from the reference");
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no '{key}' in {out}"))
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Reads a little-endian f32 C-order .npy file.
pub fn read_npy_f32(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).expect("npy file");
    assert_eq!(&bytes[..6], b"\x93NUMPY", "not an npy file");
    let (hlen, start) = if bytes[6] == 1 {
        (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10)
    } else {
        (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        )
    };
    let header = std::str::from_utf8(&bytes[start..start + hlen]).expect("header");
    assert!(header.contains("'descr': '<f4'"), "{header}");
    assert!(header.contains("'fortran_order': False"), "{header}");
    let shape_src = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .expect("shape");
    let shape: Vec<usize> = shape_src
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().expect("dim"))
        .collect();
    let data: Vec<f32> = bytes[start + hlen..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(data.len(), shape.iter().product::<usize>());
    (shape, data)
}

/// Largest absolute difference, and the reference's RMS, over a set of logit rows.
pub fn compare(got: &[f32], want: &[f32]) -> (f32, f32) {
    assert_eq!(got.len(), want.len());
    let max = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let rms = (want.iter().map(|v| v * v).sum::<f32>() / want.len() as f32).sqrt();
    (max, rms)
}

pub fn scratch_dir() -> PathBuf {
    let d = std::env::temp_dir().join("hipdecode-decode-tests");
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}
