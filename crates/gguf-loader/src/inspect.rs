//! Human and JSON reports of a GGUF file: what `hipdecode inspect` prints.

use crate::metadata::{MetadataArray, MetadataValue};
use crate::{GgufError, GgufFile, ModelConfig};
use serde_json::{json, Value as Json};
use std::io::Write;
use std::path::Path;

/// Arrays longer than this are shown by their first elements and their length.
pub const MAX_ARRAY_ITEMS_SHOWN: usize = 8;

/// Prints the header, every metadata entry (long arrays elided), the model description and
/// the tensor table, in the spirit of gguf-py's `gguf-dump`.
pub fn write_text_report(f: &GgufFile, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "* GGUF version {}, {} bytes, alignment {}, data at offset {}",
        f.version(),
        f.file_len(),
        f.alignment(),
        f.data_start()
    )?;
    writeln!(out, "* {} key/value pair(s)", f.metadata_len())?;
    for (i, (key, value)) in f.metadata().enumerate() {
        let count = value.as_array().map_or(1, |a| a.len());
        writeln!(
            out,
            "{:7}: {:<16} | {:>8} | {} = {}",
            i + 1,
            value.type_name(),
            count,
            key,
            display_value(value)
        )?;
    }
    match ModelConfig::from_gguf(f) {
        Ok(c) => {
            writeln!(out, "* model: {c:?}")?;
        }
        Err(e) => writeln!(out, "* model: not described ({e})")?,
    }
    writeln!(out, "* {} tensor(s)", f.tensors().len())?;
    let total: u64 = f.tensors().iter().map(|t| t.n_bytes).sum();
    for (i, t) in f.tensors().iter().enumerate() {
        let mut dims = [1u64; 4];
        dims[..t.dims.len()].copy_from_slice(&t.dims);
        writeln!(
            out,
            "{:7}: {:>11} | {:>6}, {:>6}, {:>6}, {:>6} | {:<6} | {:>11} | {}",
            i + 1,
            t.n_elements(),
            dims[0],
            dims[1],
            dims[2],
            dims[3],
            t.ggml_type.name(),
            t.n_bytes,
            t.name
        )?;
    }
    writeln!(out, "* tensor data: {total} bytes")?;
    let unreadable = f.unreadable_tensors();
    if !unreadable.is_empty() {
        writeln!(
            out,
            "* {} tensor(s) of a type this crate cannot read (indexed, not readable):",
            unreadable.len()
        )?;
        for u in unreadable {
            let ty = match u.type_name {
                Some(name) => format!("{name} (id {})", u.type_id),
                None => format!("unknown id {}", u.type_id),
            };
            writeln!(
                out,
                "         dims {:?} | {ty} | at most {} bytes | {}",
                u.dims, u.max_bytes, u.name
            )?;
        }
    }
    Ok(())
}

fn display_value(value: &MetadataValue<'_>) -> String {
    match value {
        MetadataValue::String(s) => format!("{s:?}"),
        MetadataValue::Array(a) => display_array(a),
        other => scalar_json(other).to_string(),
    }
}

fn display_array(a: &MetadataArray<'_>) -> String {
    let shown: Vec<String> = a
        .iter()
        .take(MAX_ARRAY_ITEMS_SHOWN)
        .map(|v| display_value(&v))
        .collect();
    let more = if a.len() > MAX_ARRAY_ITEMS_SHOWN {
        format!(", ... ({} more)", a.len() - MAX_ARRAY_ITEMS_SHOWN)
    } else {
        String::new()
    };
    format!("[{}{more}]", shown.join(", "))
}

fn scalar_json(value: &MetadataValue<'_>) -> Json {
    match *value {
        MetadataValue::U8(v) => json!(v),
        MetadataValue::I8(v) => json!(v),
        MetadataValue::U16(v) => json!(v),
        MetadataValue::I16(v) => json!(v),
        MetadataValue::U32(v) => json!(v),
        MetadataValue::I32(v) => json!(v),
        MetadataValue::U64(v) => json!(v),
        MetadataValue::I64(v) => json!(v),
        // Through the shortest decimal form, so 1e-6 prints as 1e-6, not 9.999999974752427e-7.
        MetadataValue::F32(v) => format!("{v:?}")
            .parse::<f64>()
            .map_or(Json::Null, |f| json!(f)),
        MetadataValue::F64(v) => json!(v),
        MetadataValue::Bool(v) => json!(v),
        MetadataValue::String(s) => json!(s),
        MetadataValue::Array(ref a) => array_json(a, usize::MAX),
    }
}

fn array_json(a: &MetadataArray<'_>, max_items: usize) -> Json {
    let items: Vec<Json> = a.iter().take(max_items).map(|v| scalar_json(&v)).collect();
    if a.len() <= max_items {
        return Json::Array(items);
    }
    json!({ "elided": true, "len": a.len(), "type": a.elem_type().name(), "first": items })
}

/// The whole description as JSON: header, metadata (arrays longer than `max_array_items`
/// replaced by `{"elided": true, "len", "type", "first"}`), model description, tensors.
pub fn json_report_with(f: &GgufFile, max_array_items: usize) -> Json {
    let mut metadata = serde_json::Map::new();
    for (key, value) in f.metadata() {
        let v = match value {
            MetadataValue::Array(a) => array_json(a, max_array_items),
            other => scalar_json(other),
        };
        metadata.insert(key.to_owned(), v);
    }
    let model = match ModelConfig::from_gguf(f) {
        Ok(c) => serde_json::to_value(c).unwrap_or_else(|e| json!({ "error": e.to_string() })),
        Err(e) => json!({ "error": e.to_string() }),
    };
    let tensors: Vec<Json> = f
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ggml_type.name(),
                "dims": t.dims,
                "offset": t.offset,
                "n_bytes": t.n_bytes,
            })
        })
        .collect();
    let unreadable: Vec<Json> = f
        .unreadable_tensors()
        .iter()
        .map(|u| {
            json!({
                "name": u.name,
                "type_id": u.type_id,
                "type": u.type_name,
                "dims": u.dims,
                "offset": u.offset,
                "max_bytes": u.max_bytes,
            })
        })
        .collect();
    json!({
        "version": f.version(),
        "file_len": f.file_len(),
        "alignment": f.alignment(),
        "data_start": f.data_start(),
        "metadata": metadata,
        "model": model,
        "tensors": tensors,
        "unreadable_tensors": unreadable,
    })
}

/// [`json_report_with`] eliding arrays longer than [`MAX_ARRAY_ITEMS_SHOWN`].
pub fn json_report(f: &GgufFile) -> Json {
    json_report_with(f, MAX_ARRAY_ITEMS_SHOWN)
}

/// Dequantizes tensor `name` and writes it to `path` as a `.npy` file of f32, shaped like
/// gguf-py shapes it (outermost dimension first). A name the file stores is that tensor; a
/// name it does not may be a part of a fused one (Phi-3's `blk.0.attn_q.weight`).
pub fn write_tensor_npy(f: &GgufFile, name: &str, path: &Path) -> Result<(), GgufError> {
    let t = match f.file_tensor(name) {
        Some(t) => t,
        None => f.require_tensor(name)?,
    };
    let values = f.dequantize_tensor(t)?;
    let shape: Vec<usize> = t
        .shape_outer_first()
        .into_iter()
        .map(|d| usize::try_from(d).map_err(|_| GgufError::overflow("a tensor dimension")))
        .collect::<Result<_, _>>()?;
    crate::npy::write_f32(path, &shape, &values)
}
