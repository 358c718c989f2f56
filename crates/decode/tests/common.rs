//! Helpers of decode's tests: running the Python reference, and building models to test on.
//! What every crate's tests share (model paths, the GPU lock, RNGs, comparisons) is in the
//! `test-support` crate.

#![allow(dead_code)]

use decode::gguf_loader::synth::Preset;
use decode::gguf_loader::writer::Value;
use decode::gguf_loader::{GgmlType, GgufFile, GgufWriter, MetadataArray, MetadataValue};
use std::path::{Path, PathBuf};
use std::process::Command;
use test_support::models::{skip_unless_required, workspace_root};

/// Whether python3 with numpy and gguf (and what the tokenizer reference needs) is usable.
pub fn python_ready() -> Option<()> {
    let ok = Command::new("python3")
        .args(["-c", "import numpy, gguf, sentencepiece, regex"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Some(())
    } else {
        skip_unless_required(
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

/// How [`rebuild_gguf`] changes a file.
#[derive(Default)]
pub struct Edits {
    /// Metadata to set (replacing or adding) or, with `None`, remove.
    pub metadata: Vec<(String, Option<Value>)>,
    /// Repeat the layers' tensors cyclically up to this many layers (`blk.{i % n}` becomes
    /// `blk.{i}`); the metadata's block_count is not changed by this.
    pub layers: Option<usize>,
    /// Tensors (by their name in the new file) stored as another type instead: random valid
    /// blocks of a quantized type (`fill_random_blocks`, seeded by the name), zeros of a dense
    /// one.
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
                let mut bytes = vec![0u8; len as usize];
                if ty.block_size() > 1 {
                    let seed = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
                    });
                    let mut rng = test_support::rng::seeded(seed);
                    decode::gguf_loader::synth::fill_random_blocks(ty, &mut bytes, &mut rng);
                }
                (ty, bytes)
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

/// A synthetic preset made in memory.
pub fn preset_file(preset: Preset) -> GgufFile {
    GgufFile::from_bytes(preset_bytes(preset)).expect("a synthetic model opens")
}

/// A synthetic preset's GGUF image, for a test that edits it before opening it.
pub fn preset_bytes(preset: Preset) -> Vec<u8> {
    decode::gguf_loader::synth::preset_bytes(preset, 11).expect("the synthetic model builds")
}

/// The GGUF image of `preset` with every weight that is not f32 (the products', the
/// embeddings' and the output's) stored as `ty` instead, with random valid blocks: a model
/// whose every product reads `ty`.
#[allow(dead_code)] // not every test crate that includes this module needs it
pub fn preset_with_weights_as(preset: Preset, ty: GgmlType) -> Vec<u8> {
    let file = preset_file(preset);
    let retype = file
        .tensors()
        .iter()
        .filter(|t| t.ggml_type != GgmlType::F32)
        .map(|t| (t.name.clone(), ty))
        .collect();
    rebuild_gguf_bytes(
        &file,
        &Edits {
            retype,
            ..Default::default()
        },
    )
}

/// Logit tolerances of the CPU against the numpy reference: max |difference| <= TOL x max(1,
/// RMS of the reference logits). The exact path differs from numpy in summation order only;
/// the fast one also quantizes activations to 16 bits per block of 32.
#[allow(dead_code)]
pub const EXACT_TOL: f32 = 1e-4;
#[allow(dead_code)]
pub const FAST_TOL: f32 = 2e-3;

/// `tokens`' logits at every position on the CPU backend at both precisions, in a context of
/// 64 with prefill chunked by 10 (so chunking is exercised too), against `want`, the
/// reference's logits over a vocabulary of `vocab`.
#[allow(dead_code)]
pub fn check_cpu_logits(
    what: &str,
    file: &std::sync::Arc<GgufFile>,
    tokens: &[u32],
    want: &[f32],
    vocab: usize,
) {
    check_cpu_logits_in(what, file, tokens, want, vocab, 64)
}

/// [`check_cpu_logits`] in a context of `context` positions.
#[allow(dead_code)]
pub fn check_cpu_logits_in(
    what: &str,
    file: &std::sync::Arc<GgufFile>,
    tokens: &[u32],
    want: &[f32],
    vocab: usize,
    context: usize,
) {
    use decode::backend::cpu::CpuBackend;
    use decode::backend::Precision;
    use decode::context::ContextOptions;
    for (precision, tol) in [(Precision::Exact, EXACT_TOL), (Precision::Fast, FAST_TOL)] {
        let options = ContextOptions {
            context,
            max_batch: 10,
            all_logits: true,
            sequences: 1,
            kv_blocks: None,
        };
        let mut model = decode::session::Session::load(file, CpuBackend::new(precision), options)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(model.spec().vocab, vocab);
        let got = model.forward_all_logits(tokens).unwrap();
        let (max, rms) = test_support::tolerance::compare(&got, want);
        eprintln!("{what} {precision:?}: max |diff| {max:.2e}, reference rms {rms:.3}");
        assert!(
            max <= tol * rms.max(1.0),
            "{what} {precision:?}: max diff {max} > {tol} x max(rms {rms}, 1)"
        );
    }
}

/// Where decode's tests write the models they build.
pub fn scratch_dir() -> PathBuf {
    test_support::models::scratch_dir("decode-tests")
}

/// Whether two greedy runs that chose `leader` and `other` at one step part there at a
/// near-tie of `logits` (the run that chose `leader`): `leader`'s logit leads `other`'s by at
/// most twice `tol`, relative to max(1, RMS of the logits). `Ok` or `Err` carries the figures.
pub fn near_tie(logits: &[f32], leader: u32, other: u32, tol: f32) -> Result<String, String> {
    let lead = logits[leader as usize] - logits[other as usize];
    let rms = test_support::tolerance::rms(logits);
    let bound = 2.0 * tol * rms.max(1.0);
    let text = format!("{leader} leads {other} by {lead:.3e} (bound {bound:.3e}, rms {rms:.3})");
    if lead.is_finite() && lead <= bound {
        Ok(text)
    } else {
        Err(text)
    }
}

/// Panics unless `end` is a request's last update with `reason`.
#[track_caller]
pub fn assert_finished(end: &decode::engine::Update, reason: decode::scheduler::Finish) {
    assert!(
        matches!(end, decode::engine::Update::Finished { reason: r, .. } if *r == reason),
        "ended as {end:?}, not {reason:?}"
    );
}
