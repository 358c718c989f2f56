//! Tensors an architecture stores fused, seen as the separate tensors every other architecture
//! has. Phi-3 keeps a layer's Q, K and V projections in one `attn_qkv.weight` (their rows one
//! after another) and the gate and up projections in one `ffn_up.weight` of twice the
//! feed-forward width (gate first: llama.cpp's SwiGLU takes the SiLU of the first half).
//!
//! Each part is a range of the fused tensor's rows. A GGUF tensor is stored row by row, so the
//! range is one contiguous span of the file, and a tensor entry whose offset and size cover it
//! is the part itself, with no copy. [`parts`] says which rows each part is; the file index
//! builds the entries, and `GgufFile::tensor` answers with them (the gate/up halves shadow the
//! fused `ffn_up.weight`). So the loader, the memory planner and the offload paths read
//! `attn_q.weight` or `ffn_gate.weight` as they do for Llama, while `GgufFile::tensors` still
//! lists what the file holds.
//!
//! This module reads nothing itself: the caller passes the metadata and the tensors' row
//! counts, which keeps it below the file index that uses it.

use crate::error::GgufError;

/// The architecture whose files fuse (`Architecture::Phi3`'s name; a test keeps them equal).
const PHI3: &str = "phi3";

/// One part of a fused tensor: `name` is rows `first_row .. first_row + rows` of `fused`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// The name the part is read under.
    pub name: String,
    /// The tensor the file stores.
    pub fused: String,
    /// The part's first row in the fused tensor.
    pub first_row: u64,
    /// Its number of rows.
    pub rows: u64,
}

/// The parts of the fused tensors of a file of architecture `arch`; none for architectures that
/// fuse nothing. `metadata(key)` is a count under that key (`None` when absent), and
/// `rows(name)` the row count of the file's tensor of that name (`None` when there is none),
/// and `tensors` how many tensors the file holds. A fused tensor whose rows the metadata does
/// not account for is an error naming it.
pub fn parts(
    arch: &str,
    metadata: &dyn Fn(&str) -> Result<Option<u64>, GgufError>,
    rows: &dyn Fn(&str) -> Option<u64>,
    tensors: u64,
) -> Result<Vec<Part>, GgufError> {
    let mut out = Vec::new();
    if arch != PHI3 {
        return Ok(out);
    }
    let required = |suffix: &str| -> Result<u64, GgufError> {
        let key = format!("{arch}.{suffix}");
        metadata(&key)?.ok_or(GgufError::MissingKey { key })
    };
    let optional = |suffix: &str| metadata(&format!("{arch}.{suffix}"));
    let n_embd = required("embedding_length")?;
    let n_head = required("attention.head_count")?;
    let n_head_kv = required("attention.head_count_kv")?;
    let n_ff = required("feed_forward_length")?;
    let per_head = n_embd.checked_div(n_head).unwrap_or(0);
    let head_dim_k = optional("attention.key_length")?.unwrap_or(per_head);
    let head_dim_v = optional("attention.value_length")?.unwrap_or(per_head);
    // A layer past the file's tensor count has no tensor to fuse, so a hostile block count
    // costs no more than the file's own listing.
    for il in 0..required("block_count")?.min(tensors) {
        let name = |t: &str| format!("blk.{il}.{t}.weight");
        if let (Some(fused_rows), None) = (rows(&name("attn_qkv")), rows(&name("attn_q"))) {
            let split = [
                (name("attn_q"), n_head * head_dim_k),
                (name("attn_k"), n_head_kv * head_dim_k),
                (name("attn_v"), n_head_kv * head_dim_v),
            ];
            out.extend(split_rows(&name("attn_qkv"), fused_rows, &split)?);
        }
        if let (Some(fused_rows), None) = (rows(&name("ffn_up")), rows(&name("ffn_gate"))) {
            // An unfused ffn_up without a gate is some other layout; only twice the width is
            // Phi-3's.
            if fused_rows == 2 * n_ff {
                let split = [(name("ffn_gate"), n_ff), (name("ffn_up"), n_ff)];
                out.extend(split_rows(&name("ffn_up"), fused_rows, &split)?);
            }
        }
    }
    Ok(out)
}

/// `fused`'s `rows` cut into `split` (name, rows), in order; they must cover every row.
fn split_rows(fused: &str, rows: u64, split: &[(String, u64)]) -> Result<Vec<Part>, GgufError> {
    let want: u64 = split.iter().map(|(_, r)| r).sum();
    if rows != want {
        let names: Vec<&str> = split.iter().map(|(n, _)| n.as_str()).collect();
        return Err(GgufError::Invalid {
            what: format!("tensor {fused:?}"),
            reason: format!(
                "it has {rows} rows, but {} need {want} from the head counts and widths in the \
                 metadata",
                names.join(", ")
            ),
        });
    }
    let mut first_row = 0;
    Ok(split
        .iter()
        .map(|(name, n)| {
            let part = Part {
                name: name.clone(),
                fused: fused.to_string(),
                first_row,
                rows: *n,
            };
            first_row += n;
            part
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fusing_architecture_is_phi3() {
        assert_eq!(PHI3, crate::model::Architecture::Phi3.name());
    }
}
