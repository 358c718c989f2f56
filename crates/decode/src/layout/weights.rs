//! The weights as the load uploads them: every tensor `Model::load` reads, in its order, with
//! the bytes each backend stores and the matrix shapes that size the vendor GEMM's weight
//! block and the streamed prefetch's slots.

use super::bytes::{overflow, product};
use crate::error::{DecodeError, Result};
use crate::model::tensor_parallel::{self, Shard, Split};
use crate::model::ModelSpec;
use gguf_loader::GgufFile;
use offload::{TensorKind, WeightTensor};

/// A matrix's (rows one product covers, columns, bytes per row): a product covers one expert
/// of a stacked MoE tensor.
pub type MatrixShape = (usize, usize, usize);

/// One weight tensor of the load.
#[derive(Clone, Debug)]
pub struct LoadedWeight {
    /// The tensor as the planner sees it: its bytes are the GPU backend's (vectors as f32,
    /// matrices in their file format).
    pub tensor: WeightTensor,
    /// Its bytes in the file (of the shard's part, which the load copies out of it).
    pub file_bytes: u64,
    /// Whether it is a vector (one row), which the backends widen to f32.
    pub vector: bool,
}

impl LoadedWeight {
    /// Bytes the CPU backend books for it: the file's bytes it reads in place, and the f32
    /// copy of a vector beside them.
    pub fn cpu_bytes(&self) -> u64 {
        if self.vector {
            self.file_bytes + self.tensor.bytes
        } else {
            self.file_bytes
        }
    }
}

/// The tensors `Model::load_shard` uploads for `shard` of the model of `s` (the whole model's
/// spec), in its order, each the part the shard holds, and each matrix's shape.
pub fn loaded_weights(
    file: &GgufFile,
    s: &ModelSpec,
    shard: Shard,
) -> Result<(Vec<LoadedWeight>, Vec<MatrixShape>)> {
    let mut out = Vec::new();
    let mut matrices = Vec::new();
    let tied = file.tensor("output.weight").is_none();
    let mut add = |name: &str, layer: Option<u32>, kind: TensorKind, required: bool| {
        let Some(info) = file.tensor(name) else {
            return if required {
                Err(DecodeError::MissingTensor {
                    name: name.to_string(),
                })
            } else {
                Ok(false)
            };
        };
        let dim = |i: usize| info.dims.get(i).copied().unwrap_or(1) as usize;
        let whole_dims = [dim(0), dim(1), dim(2)];
        // The part this shard holds (the whole tensor on one rank), as the load cuts it.
        let split = tensor_parallel::split_of(s, shard, !tied, name);
        let (dims, part_bytes) = match split {
            Split::Whole => (whole_dims, info.n_bytes),
            _ => tensor_parallel::part_of(info.ggml_type, whole_dims, &split).ok_or_else(|| {
                let format = info.ggml_type;
                DecodeError::InvalidArgument(format!(
                    "{name}: rank {} of {}'s part ({split:?}) does not fall on {format}'s blocks \
                     of {} values; a split of this tensor needs a rank count that leaves each \
                     rank whole blocks",
                    shard.rank,
                    shard.ranks,
                    format.block_size()
                ))
            })?,
        };
        let [cols, rows, mats] = dims;
        let vector = rows == 1 && mats == 1;
        let bytes = if vector {
            product(name, &[cols, 4])? as u64
        } else {
            let row_bytes = usize::try_from(part_bytes).map_err(|_| overflow(name))?
                / rows.saturating_mul(mats).max(1);
            matrices.push((rows, cols, row_bytes));
            part_bytes
        };
        out.push(LoadedWeight {
            tensor: WeightTensor {
                name: name.to_string(),
                bytes,
                layer,
                kind,
            },
            file_bytes: part_bytes,
            vector,
        });
        Ok(true)
    };
    let embed_kind = if tied {
        TensorKind::Shared
    } else {
        TensorKind::Lookup {
            rows: s.vocab as u64,
        }
    };
    add("token_embd.weight", None, embed_kind, true)?;
    add("output_norm.weight", None, TensorKind::Shared, true)?;
    add("output.weight", None, TensorKind::Shared, false)?;
    if !add("rope_freqs.weight", None, TensorKind::Shared, false)? && s.long_rope.is_some() {
        add("rope_factors_long.weight", None, TensorKind::Shared, true)?;
        add("rope_factors_short.weight", None, TensorKind::Shared, true)?;
    }
    let experts = TensorKind::Experts {
        n_expert: u32::try_from(s.n_expert).map_err(|_| overflow("the expert count"))?,
        n_used: u32::try_from(s.n_expert_used).map_err(|_| overflow("the expert count"))?,
    };
    // The order is `Model::load`'s, since the allocator's segments fill in that order: the
    // biases, the Q/K norms and the FFN are read before the layer's struct, whose fields
    // then load in their written order.
    for il in 0..s.n_layers {
        let layer = Some(u32::try_from(il).map_err(|_| overflow("the layer count"))?);
        let n = |t: &str| format!("blk.{il}.{t}.weight");
        let b = |t: &str| format!("blk.{il}.{t}.bias");
        let dense = TensorKind::Dense;
        if add(&b("attn_q"), layer, dense, false)? {
            add(&b("attn_k"), layer, dense, true)?;
            add(&b("attn_v"), layer, dense, true)?;
        }
        if s.qk_norm {
            add(&n("attn_q_norm"), layer, dense, true)?;
            add(&n("attn_k_norm"), layer, dense, true)?;
        }
        if s.is_moe() {
            add(&n("ffn_gate_inp"), layer, dense, true)?;
            for t in ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] {
                add(&n(t), layer, experts, true)?;
            }
        } else {
            for t in ["ffn_gate", "ffn_up", "ffn_down"] {
                add(&n(t), layer, dense, true)?;
            }
        }
        for t in ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output"] {
            add(&n(t), layer, dense, true)?;
        }
        if s.sandwich_norms {
            add(&n("post_attention_norm"), layer, dense, true)?;
        }
        add(&n("ffn_norm"), layer, dense, true)?;
        if s.sandwich_norms {
            add(&n("post_ffw_norm"), layer, dense, true)?;
        }
    }
    Ok((out, matrices))
}
