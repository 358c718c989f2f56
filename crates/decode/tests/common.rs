//! Shared helpers of the reference tests: locating models and running the Python reference.

#![allow(dead_code)]

use decode::gguf_loader::synth::{write_preset, Preset};
use decode::gguf_loader::writer::Value;
use decode::gguf_loader::{GgmlType, GgufFile, GgufWriter, MetadataArray, MetadataValue};
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn require_models() -> bool {
    decode::gguf_loader::paths::require_models()
}

/// Skips (returns `None` with a printed reason) unless required, in which case it panics.
pub fn skip(reason: &str) -> Option<()> {
    assert!(!require_models(), "HIPDECODE_REQUIRE_MODELS=1 but {reason}");
    eprintln!("skipping: {reason}");
    None
}

pub fn models_dir() -> PathBuf {
    decode::gguf_loader::paths::models_dir()
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
    reference_logits_with(model, tokens, scratch, &[])
}

/// [`reference_logits`] with extra arguments for forward.py.
pub fn reference_logits_with(
    model: &Path,
    tokens: &[u32],
    scratch: &Path,
    extra: &[&str],
) -> (Vec<f32>, usize) {
    let stem = model
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let out = scratch.join(format!(
        "ref-logits-{stem}-{}-{}-{}.npy",
        tokens.len(),
        extra.join("_").replace('-', ""),
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
        ]
        .into_iter()
        .chain(extra.iter().map(|a| a.to_string()))
        .collect::<Vec<_>>(),
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

/// Largest |got - want| over two slices of equal length. NaN anywhere (in either input, or
/// from inf - inf) is an error naming the first position: `f32::max` would skip it, so a NaN
/// logit would pass any tolerance.
pub fn try_max_abs_diff(got: &[f32], want: &[f32]) -> Result<f32, String> {
    if got.len() != want.len() {
        return Err(format!("{} values compared with {}", got.len(), want.len()));
    }
    let mut max = 0.0f32;
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let d = (a - b).abs();
        if d.is_nan() {
            return Err(format!("NaN at index {i}: got {a}, want {b}"));
        }
        max = max.max(d);
    }
    Ok(max)
}

/// The gap between the two largest logits and the logits' RMS: where two greedy runs part,
/// a gap within a small multiple of the RMS is a near-tie that f32 rounding may flip.
pub fn top2_margin(logits: &[f32]) -> (f32, f32) {
    let mut sorted = logits.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let rms = (logits.iter().map(|v| v * v).sum::<f32>() / logits.len() as f32).sqrt();
    (sorted[0] - sorted[1], rms)
}

/// [`try_max_abs_diff`], failing the test on NaN or a length mismatch.
pub fn max_abs_diff(got: &[f32], want: &[f32]) -> f32 {
    try_max_abs_diff(got, want).unwrap_or_else(|e| panic!("logit comparison failed: {e}"))
}

/// Largest absolute difference, and the reference's RMS, over a set of logit rows.
pub fn compare(got: &[f32], want: &[f32]) -> (f32, f32) {
    let max = max_abs_diff(got, want);
    let rms = (want.iter().map(|v| v * v).sum::<f32>() / want.len() as f32).sqrt();
    (max, rms)
}

/// How [`rebuild_gguf`] changes a file.
#[derive(Default)]
pub struct Edits {
    /// Metadata to set (replacing or adding) or, with `None`, remove.
    pub metadata: Vec<(String, Option<Value>)>,
    /// Repeat the layers' tensors cyclically up to this many layers (`blk.{i % n}` becomes
    /// `blk.{i}`); the metadata's block_count is not changed by this.
    pub layers: Option<usize>,
    /// Tensors (by their name in the new file) stored as another type instead, zero-filled.
    pub retype: Vec<(String, GgmlType)>,
}

/// A copy of `file` with `edits` applied: a crafted model built from a synthetic one.
pub fn rebuild_gguf(file: &GgufFile, edits: &Edits) -> GgufFile {
    GgufFile::from_bytes(rebuild_gguf_bytes(file, edits)).expect("the rebuilt file opens")
}

/// The bytes of [`rebuild_gguf`]'s file.
pub fn rebuild_gguf_bytes(file: &GgufFile, edits: &Edits) -> Vec<u8> {
    let mut w = GgufWriter::new();
    let edit = |k: &str| edits.metadata.iter().find(|(e, _)| e == k);
    if file.get("general.alignment").is_some() {
        w.set_alignment(file.get_u32("general.alignment").unwrap())
            .unwrap();
    }
    for (k, v) in file.metadata() {
        if k == "general.alignment" {
            continue;
        }
        match edit(k) {
            Some((_, Some(new))) => w.add(k, new.clone()).unwrap(),
            Some((_, None)) => {}
            None => w.add(k, owned(v)).unwrap(),
        }
    }
    for (k, v) in &edits.metadata {
        if let (None, Some(v)) = (file.get(k), v) {
            w.add(k.as_str(), v.clone()).unwrap();
        }
    }
    let layer_of = |name: &str| -> Option<(usize, String)> {
        let rest = name.strip_prefix("blk.")?;
        let (il, tail) = rest.split_once('.')?;
        Some((il.parse().ok()?, tail.to_string()))
    };
    let src_layers = file
        .tensors()
        .iter()
        .filter_map(|t| layer_of(&t.name).map(|(il, _)| il + 1))
        .max()
        .unwrap_or(0);
    let copy = |w: &mut GgufWriter, name: String, t: &decode::gguf_loader::TensorInfo| {
        let (ty, bytes) = match edits.retype.iter().find(|(n, _)| *n == name) {
            Some(&(_, ty)) => {
                let n = t.dims.iter().product();
                let len = ty.bytes_for(n).expect("whole blocks of the new type");
                (ty, vec![0u8; len as usize])
            }
            None => (t.ggml_type, file.tensor_data(t).to_vec()),
        };
        w.add_tensor(name, &t.dims, ty, bytes).unwrap();
    };
    for t in file.tensors() {
        if layer_of(&t.name).is_none() {
            copy(&mut w, t.name.clone(), t);
        }
    }
    for il in 0..edits.layers.unwrap_or(src_layers) {
        for t in file.tensors() {
            if let Some((from, tail)) = layer_of(&t.name) {
                if from == il % src_layers {
                    copy(&mut w, format!("blk.{il}.{tail}"), t);
                }
            }
        }
    }
    w.to_bytes().expect("the rebuilt file serializes")
}

fn owned(v: &MetadataValue<'_>) -> Value {
    match v {
        MetadataValue::U8(x) => Value::U8(*x),
        MetadataValue::I8(x) => Value::I8(*x),
        MetadataValue::U16(x) => Value::U16(*x),
        MetadataValue::I16(x) => Value::I16(*x),
        MetadataValue::U32(x) => Value::U32(*x),
        MetadataValue::I32(x) => Value::I32(*x),
        MetadataValue::F32(x) => Value::F32(*x),
        MetadataValue::Bool(x) => Value::Bool(*x),
        MetadataValue::String(x) => Value::String(x.to_string()),
        MetadataValue::U64(x) => Value::U64(*x),
        MetadataValue::I64(x) => Value::I64(*x),
        MetadataValue::F64(x) => Value::F64(*x),
        MetadataValue::Array(a) => match a {
            MetadataArray::Strings(items) => Value::strings(items.iter().copied()),
            MetadataArray::Scalars { elem, .. } => Value::Array {
                elem: *elem,
                items: a.iter().map(|x| owned(&x)).collect(),
            },
            MetadataArray::Arrays(_) => panic!("nested arrays are not needed by these tests"),
        },
    }
}

/// A synthetic preset loaded into memory (written to a scratch file, which is removed).
pub fn preset_file(preset: Preset) -> GgufFile {
    let path = scratch_dir().join(format!(
        "common-{}-{}-{:?}.gguf",
        preset.name(),
        std::process::id(),
        std::thread::current().id()
    ));
    write_preset(preset, &path, 11).expect("write the synthetic model");
    let bytes = std::fs::read(&path).expect("read it back");
    std::fs::remove_file(&path).ok();
    GgufFile::from_bytes(bytes).expect("a synthetic model opens")
}

pub fn scratch_dir() -> PathBuf {
    let d = std::env::temp_dir().join("hipdecode-decode-tests");
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}
