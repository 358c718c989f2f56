//! A model split over ranks for tensor parallelism: which part of each weight a rank holds,
//! and the spec of that part.
//!
//! The split is Megatron's: each attention block and each feed-forward block is split so that
//! its input is whole on every rank and its output is a partial sum, which one all-reduce
//! makes whole again (`Backend::all_reduce_sum`, after the attention output and after the
//! feed-forward's down projection). So per layer:
//! - query heads are split evenly, with their rows of `attn_q` and columns of `attn_output`;
//!   a rank keeps the K/V heads its query heads read (`attn_k`, `attn_v` and the KV cache),
//!   each K/V head on one rank when there are at least as many as ranks, else on every rank of
//!   its query group;
//! - the feed-forward width is split: rows of `ffn_gate` and `ffn_up`, columns of `ffn_down`,
//!   and for a mixture of experts the same within every expert (the router stays whole);
//! - the output projection is split by vocabulary (its rows) when it is a tensor of its own and
//!   the ranks divide the vocabulary: each rank computes its rows' logits and one all-gather
//!   joins them (`Backend::all_gather_cols`), so each rank holds `1 / ranks` of the largest
//!   matrix of most models (411 MiB of the 8B shape's Q6_K);
//! - norms, embeddings (looked up whole), an output tied to the embedding and RoPE factors
//!   stay whole on every rank.
//!
//! A column split cuts every row of a quantized matrix, so it must fall on the format's block
//! boundaries; a shape that cannot be split is refused with what would fit.

use crate::error::{DecodeError, Result};
use crate::model::ModelSpec;
use crate::quant;
use gguf_loader::GgmlType;
use std::ops::Range;

/// One rank's place in a split: rank `rank` of `ranks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub rank: usize,
    pub ranks: usize,
}

impl Shard {
    /// Rank `rank` of `ranks`; an error when the rank is not below the count.
    pub fn new(rank: usize, ranks: usize) -> Result<Shard> {
        if ranks == 0 || rank >= ranks {
            return Err(DecodeError::InvalidArgument(format!(
                "rank {rank} of {ranks}: a tensor-parallel rank is 0 to ranks - 1"
            )));
        }
        Ok(Shard { rank, ranks })
    }

    /// The whole model on one rank.
    pub fn whole() -> Shard {
        Shard { rank: 0, ranks: 1 }
    }

    pub fn is_whole(&self) -> bool {
        self.ranks == 1
    }

    /// This rank's even part of `0..len` (which the ranks divide).
    fn part(&self, len: usize) -> Range<usize> {
        let each = len / self.ranks;
        self.rank * each..(self.rank + 1) * each
    }

    /// This rank's query heads.
    fn query_heads(&self, spec: &ModelSpec) -> Range<usize> {
        self.part(spec.n_head)
    }

    /// The K/V heads this rank's query heads read: its even share when there are at least as
    /// many K/V heads as ranks, else the one head of its query group.
    fn kv_heads(&self, spec: &ModelSpec) -> Range<usize> {
        let group = spec.n_head / spec.n_head_kv;
        let q = self.query_heads(spec);
        q.start / group..(q.end - 1) / group + 1
    }
}

/// The spec of `shard`'s part of a model of `spec`, or why the model cannot be split so.
pub fn shard_spec(spec: &ModelSpec, shard: Shard) -> Result<ModelSpec> {
    if shard.is_whole() {
        return Ok(spec.clone());
    }
    let r = shard.ranks;
    let refuse = |what: String| {
        Err(DecodeError::InvalidArgument(format!(
            "{} cannot be split over {r} ranks: {what}; use a rank count that divides it",
            spec.arch_name
        )))
    };
    if !spec.n_head.is_multiple_of(r) {
        return refuse(format!("{} query heads", spec.n_head));
    }
    let kv = spec.n_head_kv;
    let kv_splits = if kv >= r {
        kv.is_multiple_of(r)
    } else {
        r.is_multiple_of(kv)
    };
    if !kv_splits {
        return refuse(format!(
            "{kv} K/V heads (neither a multiple nor a divisor of it)"
        ));
    }
    let ff = if spec.is_moe() {
        spec.n_ff_expert
    } else {
        spec.n_ff
    };
    if !ff.is_multiple_of(r) {
        return refuse(format!("a feed-forward width of {ff}"));
    }
    let heads = shard.query_heads(spec).len();
    let kv_heads = shard.kv_heads(spec).len();
    let mut part = spec.clone();
    part.n_head = heads;
    part.n_head_kv = kv_heads;
    part.widths.q = heads * spec.head_dim_k;
    part.widths.o = heads * spec.head_dim_v;
    part.widths.k = kv_heads * spec.head_dim_k;
    part.widths.v = kv_heads * spec.head_dim_v;
    if spec.is_moe() {
        part.n_ff_expert = ff / r;
    } else {
        part.n_ff = ff / r;
    }
    Ok(part)
}

/// Which part of a stored tensor a rank loads.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Split {
    Whole,
    /// Rows (outputs) of every matrix.
    Rows(Range<usize>),
    /// Columns (inputs) of every row: cuts within rows, on block boundaries.
    Cols(Range<usize>),
}

/// The splits of one layer's tensors for `shard` of a model of `spec` (the whole model's).
pub(crate) struct LayerSplits {
    pub q: Split,
    pub k: Split,
    pub v: Split,
    pub o: Split,
    /// Rows of `ffn_gate`/`ffn_up` (or of each expert's), columns of `ffn_down`.
    pub ff_rows: Split,
    pub ff_cols: Split,
}

impl LayerSplits {
    pub fn new(spec: &ModelSpec, shard: Shard) -> LayerSplits {
        if shard.is_whole() {
            return LayerSplits {
                q: Split::Whole,
                k: Split::Whole,
                v: Split::Whole,
                o: Split::Whole,
                ff_rows: Split::Whole,
                ff_cols: Split::Whole,
            };
        }
        let scale = |r: Range<usize>, by: usize| r.start * by..r.end * by;
        let q = shard.query_heads(spec);
        let kv = shard.kv_heads(spec);
        let ff = shard.part(if spec.is_moe() {
            spec.n_ff_expert
        } else {
            spec.n_ff
        });
        LayerSplits {
            q: Split::Rows(scale(q.clone(), spec.head_dim_k)),
            k: Split::Rows(scale(kv.clone(), spec.head_dim_k)),
            v: Split::Rows(scale(kv, spec.head_dim_v)),
            o: Split::Cols(scale(q, spec.head_dim_v)),
            ff_rows: Split::Rows(ff.clone()),
            ff_cols: Split::Cols(ff),
        }
    }
}

/// `shard`'s rows of a model's output projection: its part of the vocabulary where the
/// projection is a tensor of its own (`untied`) and the ranks divide the vocabulary, else the
/// whole (a tied projection is the embedding table, which every rank looks tokens up in).
pub(crate) fn output_split(spec: &ModelSpec, shard: Shard, untied: bool) -> Split {
    if shard.is_whole() || !untied || !spec.vocab.is_multiple_of(shard.ranks) {
        return Split::Whole;
    }
    Split::Rows(shard.part(spec.vocab))
}

/// The part of tensor `name` that `shard` of a model of `whole` loads, as `Model::load_shard`
/// cuts it (`untied`: the output projection is its own tensor), so the layout prices the part
/// the load holds.
pub(crate) fn split_of(whole: &ModelSpec, shard: Shard, untied: bool, name: &str) -> Split {
    if shard.is_whole() {
        return Split::Whole;
    }
    if name == "output.weight" {
        return output_split(whole, shard, untied);
    }
    let Some((_, tensor)) = name.strip_prefix("blk.").and_then(|n| n.split_once('.')) else {
        return Split::Whole;
    };
    let splits = LayerSplits::new(whole, shard);
    match tensor {
        "attn_q.weight" => splits.q,
        "attn_k.weight" => splits.k,
        "attn_v.weight" => splits.v,
        "attn_output.weight" => splits.o,
        "attn_q.bias" => bias_split(&splits.q),
        "attn_k.bias" => bias_split(&splits.k),
        "attn_v.bias" => bias_split(&splits.v),
        "ffn_gate.weight" | "ffn_up.weight" | "ffn_gate_exps.weight" | "ffn_up_exps.weight" => {
            splits.ff_rows
        }
        "ffn_down.weight" | "ffn_down_exps.weight" => splits.ff_cols,
        _ => Split::Whole,
    }
}

/// The dims and bytes of `split`'s part of a tensor of `format` and `dims` (as [`slice`] cuts
/// it), or `None` where the part is not whole blocks.
pub(crate) fn part_of(
    format: GgmlType,
    dims: [usize; 3],
    split: &Split,
) -> Option<([usize; 3], u64)> {
    let [cols, rows, mats] = dims;
    let part = match split {
        Split::Whole => dims,
        Split::Rows(r) => [cols, r.len(), mats],
        Split::Cols(c) => [c.len(), rows, mats],
    };
    let bytes = quant::row_bytes(format, part[0])?
        .checked_mul(part[1])?
        .checked_mul(part[2])?;
    Some((part, bytes as u64))
}

/// A bias vector's part under `split` of its projection's rows: the same range of its values.
pub(crate) fn bias_split(rows: &Split) -> Split {
    match rows {
        Split::Rows(r) => Split::Cols(r.clone()),
        other => other.clone(),
    }
}

/// The bytes and dims of `split`'s part of a tensor of `format` and `dims` (GGML order:
/// columns, rows, matrices) stored in `bytes`. `name` is for errors.
pub(crate) fn slice(
    name: &str,
    format: GgmlType,
    dims: [usize; 3],
    bytes: &[u8],
    split: &Split,
) -> Result<(Vec<u8>, [usize; 3])> {
    let [cols, rows, mats] = dims;
    let shape_error = |what: String| DecodeError::InvalidArgument(format!("{name}: {what}"));
    let row_bytes = quant::row_bytes(format, cols)
        .ok_or_else(|| shape_error(format!("{cols} columns are not whole {format} blocks")))?;
    if bytes.len() != row_bytes * rows * mats {
        return Err(shape_error(format!(
            "{} bytes for {cols} x {rows} x {mats} {format} values",
            bytes.len()
        )));
    }
    match split {
        Split::Whole => Ok((bytes.to_vec(), dims)),
        Split::Rows(r) => {
            if r.end > rows || r.is_empty() {
                return Err(shape_error(format!("rows {r:?} of {rows}")));
            }
            let mut out = Vec::with_capacity(r.len() * row_bytes * mats);
            for m in 0..mats {
                let matrix = &bytes[m * rows * row_bytes..(m + 1) * rows * row_bytes];
                out.extend_from_slice(&matrix[r.start * row_bytes..r.end * row_bytes]);
            }
            Ok((out, [cols, r.len(), mats]))
        }
        Split::Cols(c) => {
            let block = format.block_size();
            if c.end > cols || c.is_empty() {
                return Err(shape_error(format!("columns {c:?} of {cols}")));
            }
            if !c.start.is_multiple_of(block) || !c.end.is_multiple_of(block) {
                return Err(shape_error(format!(
                    "columns {c:?} do not fall on {format}'s blocks of {block} values; a split \
                     of this tensor needs a rank count that leaves each rank whole blocks"
                )));
            }
            let block_bytes = quant::row_bytes(format, block).unwrap_or(0);
            let (from, to) = (c.start / block * block_bytes, c.end / block * block_bytes);
            let mut out = Vec::with_capacity((to - from) * rows * mats);
            for row in bytes.chunks_exact(row_bytes) {
                out.extend_from_slice(&row[from..to]);
            }
            Ok((out, [c.len(), rows, mats]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_is_split_by_vocabulary_only_where_it_is_its_own_and_divides() {
        let bytes = gguf_loader::synth::preset_bytes(gguf_loader::synth::Preset::TinyLlama, 1);
        let file = gguf_loader::GgufFile::from_bytes(bytes.unwrap()).unwrap();
        let tiny = ModelSpec::from_gguf(&file).unwrap();
        let spec = |vocab| ModelSpec {
            vocab,
            ..tiny.clone()
        };
        let (two, whole) = (Shard::new(1, 2).unwrap(), Shard::whole());
        assert_eq!(output_split(&spec(512), two, true), Split::Rows(256..512));
        assert_eq!(output_split(&spec(512), two, false), Split::Whole, "tied");
        assert_eq!(output_split(&spec(513), two, true), Split::Whole, "odd");
        assert_eq!(output_split(&spec(512), whole, true), Split::Whole);
    }

    #[test]
    fn rows_and_columns_slice_every_matrix_on_block_boundaries() {
        // Two matrices of 3 rows x 64 f32 columns, value = index.
        let dims = [64, 3, 2];
        let values: Vec<f32> = (0..64 * 3 * 2).map(|i| i as f32).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let as_f32 = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        let (rows, d) = slice("t", GgmlType::F32, dims, &bytes, &Split::Rows(1..3)).unwrap();
        assert_eq!(d, [64, 2, 2]);
        let want: Vec<f32> = (64..192).chain(256..384).map(|i| i as f32).collect();
        assert_eq!(as_f32(&rows), want);
        let (cols, d) = slice("t", GgmlType::F32, dims, &bytes, &Split::Cols(32..40)).unwrap();
        assert_eq!(d, [8, 3, 2]);
        let want: Vec<f32> = (0..6)
            .flat_map(|row| (32..40).map(move |c| (row * 64 + c) as f32))
            .collect();
        assert_eq!(as_f32(&cols), want);
        // Q8_0 rows of 64 values are two blocks of 34 bytes: a cut at 32 keeps the second.
        let q8: Vec<u8> = (0..68 * 3).map(|i| i as u8).collect();
        let (half, d) = slice("q", GgmlType::Q8_0, [64, 3, 1], &q8, &Split::Cols(32..64)).unwrap();
        assert_eq!(d, [32, 3, 1]);
        let want: Vec<u8> = (0..3)
            .flat_map(|r| (r * 68 + 34..r * 68 + 68).map(|i| i as u8))
            .collect();
        assert_eq!(half, want);
        let e = slice("q", GgmlType::Q8_0, [64, 3, 1], &q8, &Split::Cols(16..48)).unwrap_err();
        assert!(e.to_string().contains("blocks of 32"), "{e}");
    }
}
