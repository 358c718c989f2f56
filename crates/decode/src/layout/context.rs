//! What a context holds besides the weights: the KV cache of each layer and the activation
//! buffers a step writes. `Context::new` sizes both with these functions, and
//! [`super::ModelLayout`] lists the same buffers, so the estimate is the allocation.
//!
//! A context holds `n_seq` sequences. Its KV storage is paged ([`KvPlan`]): the layers that
//! hold the whole context share a pool of blocks, by default enough for every sequence at full
//! length, and each ring-buffered sliding-window layer holds a run of blocks per sequence; the
//! activations hold the step's rows, at most `max_batch` over all sequences, and the logits one
//! row per sequence (every row of the step with `all_logits`).

use super::bytes::overflow;
use crate::backend::{Attention, MoeShape, StepBounds};
use crate::error::{DecodeError, Result};
use crate::kv::{BlockTables, KvGroup, KvType};
use crate::model::ModelSpec;

/// The positions a context keeps: the requested context, clamped to the model's trained one.
pub fn clamp_context(spec: &ModelSpec, context: usize) -> usize {
    context.min(spec.context_length.max(1))
}

/// KV slots per sequence of each layer for a context of `context` positions (already
/// clamped) and steps of up to `max_batch` tokens: the context on a full layer; on a
/// sliding-window layer a ring of `window + max_batch - 1` slots (enough for a whole prefill
/// chunk) when that is smaller.
fn kv_slots(spec: &ModelSpec, context: usize, max_batch: usize) -> Vec<usize> {
    spec.layers
        .iter()
        .map(|l| match l.window {
            Some(w) => context.min(w.saturating_add(max_batch.saturating_sub(1))),
            None => context,
        })
        .collect()
}

/// The largest step of a context with KV storage `kv` and steps of at most `max_batch` rows:
/// what the backend reserves its workspace for.
pub fn step_bounds(spec: &ModelSpec, kv: &KvPlan, max_batch: usize) -> StepBounds {
    let s = spec;
    StepBounds {
        max_tokens: max_batch,
        decode_attention: s
            .layers
            .iter()
            .zip(&kv.slots)
            .map(|(l, &slots)| Attention {
                // A decode step carries a row per sequence, up to the step's rows.
                n_tokens: max_batch.min(kv.sequences).max(1),
                n_head: s.n_head,
                n_head_kv: s.n_head_kv,
                head_dim_k: s.head_dim_k,
                head_dim_v: s.head_dim_v,
                scale: s.attn_scale,
                softcap: s.attn_softcap,
                window: l.window,
                slots,
            })
            .collect(),
        moe: s.is_moe().then_some(MoeShape {
            rows: max_batch,
            n_embd: s.n_embd,
            n_ff: s.n_ff_expert,
            n_expert: s.n_expert,
            k: s.n_expert_used,
            act: s.gate,
        }),
        table_entries: kv.table_entries(),
    }
}

/// How a context's KV storage is paged: the block size, each layer's slots per sequence and
/// group, and the blocks of each group's buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvPlan {
    /// Positions per block.
    pub block: usize,
    pub sequences: usize,
    /// Slots per sequence of each layer (whole blocks).
    pub slots: Vec<usize>,
    /// Each layer's group: [`KvGroup::POOL`], or ring group `1 + i` of `ring_slots[i]`.
    pub groups: Vec<KvGroup>,
    /// Slots per sequence of the pool's layers: the context in whole blocks.
    pub pool_slots: usize,
    /// Blocks in each of the pool's layers' buffers.
    pub pool_blocks: usize,
    /// Slots per sequence of each ring group.
    pub ring_slots: Vec<usize>,
}

impl KvPlan {
    /// Bytes of layer `layer`'s key and value buffers for rows of `(k_dim, v_dim)` values
    /// stored as `kv`: what `ModelLayout` lists and the backend allocates.
    pub fn layer_bytes(
        &self,
        layer: usize,
        (k_dim, v_dim): (usize, usize),
        kv: KvType,
    ) -> Result<[usize; 2]> {
        Ok([
            kv_buffer_bytes(self.values(layer, k_dim)?, kv)?,
            kv_buffer_bytes(self.values(layer, v_dim)?, kv)?,
        ])
    }

    /// Bytes of every layer's buffers ([`KvPlan::layer_bytes`]) together.
    pub fn total_bytes(&self, dims: (usize, usize), kv: KvType) -> Result<u64> {
        (0..self.slots.len()).try_fold(0u64, |sum, il| {
            let [k, v] = self.layer_bytes(il, dims, kv)?;
            Ok(sum.saturating_add(k as u64).saturating_add(v as u64))
        })
    }

    /// Rows of layer `layer`'s key (and value) buffer.
    pub fn rows(&self, layer: usize) -> Result<usize> {
        let rows = match self.groups[layer] {
            KvGroup::POOL => self.pool_blocks.checked_mul(self.block),
            _ => self.slots[layer].checked_mul(self.sequences),
        };
        rows.ok_or_else(|| overflow("the KV cache"))
    }

    /// Values of layer `layer`'s key (or value) buffer of `dim` values per row.
    pub fn values(&self, layer: usize, dim: usize) -> Result<usize> {
        let rows = self.rows(layer)?;
        rows.checked_mul(dim)
            .ok_or_else(|| DecodeError::Allocation {
                what: "the KV cache".into(),
                reason: format!("{rows} positions of {dim} values overflow"),
            })
    }

    /// Entries of every group's tables together: a block per `block` slots of each sequence.
    pub fn table_entries(&self) -> usize {
        std::iter::once(self.pool_slots)
            .chain(self.ring_slots.iter().copied())
            .map(|slots| slots / self.block * self.sequences)
            .sum()
    }

    /// The tables this storage starts with.
    /// Whether the pool is shared: fewer blocks than every sequence's whole context, so a
    /// scheduler hands blocks out (and the storage can grow with them); otherwise each
    /// sequence owns its run of blocks from the start.
    pub fn pool_is_shared(&self) -> bool {
        self.pool_blocks < self.pool_slots / self.block.max(1) * self.sequences
    }

    pub fn tables(&self) -> Result<BlockTables> {
        BlockTables::new(
            self.block,
            self.sequences,
            self.pool_slots,
            self.pool_blocks,
            &self.ring_slots,
        )
    }
}

/// The paged KV storage of a context of `context` positions (already clamped) per sequence,
/// steps of up to `max_batch` rows and `sequences` sequences, in blocks of `block` positions:
/// a ring layer's slots (see `kv_slots`) and the context rounded up to whole blocks, and a
/// pool of `pool_blocks` blocks (by default every sequence's whole context).
pub fn kv_plan(
    spec: &ModelSpec,
    context: usize,
    max_batch: usize,
    sequences: usize,
    block: usize,
    pool_blocks: Option<usize>,
) -> Result<KvPlan> {
    if !block.is_power_of_two() {
        return Err(DecodeError::InvalidArgument(format!(
            "a KV block of {block} positions: the block length must be a power of two"
        )));
    }
    let whole = |n: usize| n.div_ceil(block).max(1).checked_mul(block);
    let pool_slots = whole(context).ok_or_else(|| overflow("the KV cache"))?;
    let mut ring_slots: Vec<usize> = Vec::new();
    let mut slots = Vec::new();
    let mut groups = Vec::new();
    for n in kv_slots(spec, context, max_batch) {
        let n = whole(n).ok_or_else(|| overflow("the KV cache"))?;
        if n >= pool_slots {
            slots.push(pool_slots);
            groups.push(KvGroup::POOL);
        } else {
            let i = match ring_slots.iter().position(|&r| r == n) {
                Some(i) => i,
                None => {
                    ring_slots.push(n);
                    ring_slots.len() - 1
                }
            };
            slots.push(n);
            groups.push(KvGroup(1 + i));
        }
    }
    let all = (pool_slots / block)
        .checked_mul(sequences)
        .ok_or_else(|| overflow("the KV cache"))?;
    Ok(KvPlan {
        block,
        sequences,
        slots,
        groups,
        pool_slots,
        pool_blocks: pool_blocks.unwrap_or(all),
        ring_slots,
    })
}

/// Bytes one block of the KV pool takes over the pool's layers (those that keep the whole
/// context), stored as `kv`: what a KV budget in bytes is divided by to give the pool's
/// blocks.
pub fn pool_block_bytes(
    spec: &ModelSpec,
    context: usize,
    max_batch: usize,
    kv: KvType,
) -> Result<u64> {
    let plan = kv_plan(
        spec,
        context,
        max_batch,
        1,
        crate::kv::block_positions(),
        None,
    )?;
    let pool_layers = (plan.groups.iter())
        .filter(|g| **g == KvGroup::POOL)
        .count();
    let per_position = kv_row_bytes(kv, spec.widths.k)? + kv_row_bytes(kv, spec.widths.v)?;
    Ok(pool_layers as u64 * plan.block as u64 * per_position as u64)
}

/// Bytes of one row of `dim` values stored as `kv`, or an error where `dim` is not whole
/// blocks of the type (a q8_0 cache of a model whose K or V rows are not 32-value blocks).
pub fn kv_row_bytes(kv: KvType, dim: usize) -> Result<usize> {
    kv.bytes(dim).ok_or_else(|| {
        DecodeError::InvalidArgument(format!(
            "a {kv} KV cache stores rows of whole {}-value blocks, but this model's K or V rows \
             have {dim} values; use -ctk f16 -ctv f16",
            kv.block_values()
        ))
    })
}

/// Bytes the GPU backend asks for a buffer of `values` values of `elem_bytes`: whole f32
/// words, so the zeroing kernel covers an odd count of f16 values too.
pub fn gpu_buffer_bytes(values: usize, elem_bytes: usize) -> Option<usize> {
    values
        .checked_mul(elem_bytes)
        .and_then(|b| b.checked_next_multiple_of(4))
}

/// The activation buffers of a step, in `Context::new`'s order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Residual,
    Normalized,
    Query,
    Key,
    Value,
    Attention,
    Projection,
    FfnGate,
    FfnUp,
    Router,
    Logits,
}

impl Activation {
    pub const ALL: [Activation; 11] = [
        Activation::Residual,
        Activation::Normalized,
        Activation::Query,
        Activation::Key,
        Activation::Value,
        Activation::Attention,
        Activation::Projection,
        Activation::FfnGate,
        Activation::FfnUp,
        Activation::Router,
        Activation::Logits,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Activation::Residual => "residual",
            Activation::Normalized => "normalized",
            Activation::Query => "query",
            Activation::Key => "key",
            Activation::Value => "value",
            Activation::Attention => "attention",
            Activation::Projection => "projection",
            Activation::FfnGate => "FFN gate",
            Activation::FfnUp => "FFN up",
            Activation::Router => "router",
            Activation::Logits => "logits",
        }
    }
}

/// The activation buffers' sizes (f32 values each), and which of them matrix products read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActivationSizes {
    values: [usize; 11],
    logit_rows: usize,
    /// The buffers matrix products read, with their row width: the normalized rows (Q/K/V,
    /// gate/up, router, output), the attention output and, in a dense FFN, the gated
    /// activations. A GPU backend keeps an 8-bit copy of each.
    pub matmul_inputs: Vec<(Activation, usize)>,
}

impl ActivationSizes {
    /// f32 values of `which`.
    pub fn values(&self, which: Activation) -> usize {
        self.values[which as usize]
    }

    /// Rows of the logits buffer.
    pub fn logit_rows(&self) -> usize {
        self.logit_rows
    }
}

/// The activation buffers of a context of `n_seq` sequences whose steps carry up to
/// `max_batch` tokens.
pub fn activations(
    s: &ModelSpec,
    max_batch: usize,
    n_seq: usize,
    all_logits: bool,
) -> Result<ActivationSizes> {
    let (e, qd, kd, vd) = (s.n_embd, s.widths.q, s.widths.k, s.widths.v);
    // MoE layers have no dense FFN here, so feed_forward_length sizes nothing for them.
    let ff = if s.is_moe() { s.n_ff_expert } else { s.n_ff };
    // One row per sequence (no more than a step carries), or every row of the step.
    let logit_rows = if all_logits {
        max_batch
    } else {
        n_seq.min(max_batch)
    };
    let shape = |which: Activation| match which {
        Activation::Residual | Activation::Projection => (max_batch, e),
        Activation::Normalized => (max_batch, e.max(qd)),
        Activation::Query => (max_batch, qd),
        Activation::Key => (max_batch, kd),
        Activation::Value => (max_batch, vd),
        Activation::Attention => (max_batch, s.widths.o),
        Activation::FfnGate | Activation::FfnUp => (max_batch, ff),
        Activation::Router => (max_batch, s.n_expert.max(1)),
        Activation::Logits => (logit_rows, s.vocab),
    };
    let mut values = [0usize; 11];
    for which in Activation::ALL {
        let (rows, width) = shape(which);
        values[which as usize] = rows
            .checked_mul(width)
            .filter(|n| n.checked_mul(4).is_some())
            .ok_or_else(|| DecodeError::Allocation {
                what: format!("the {} activations", which.name()),
                reason: format!("{rows} rows of {width} values overflow"),
            })?;
    }
    let mut matmul_inputs = vec![
        (Activation::Normalized, e.max(qd)),
        (Activation::Attention, s.widths.o),
    ];
    if !s.is_moe() {
        matmul_inputs.push((Activation::FfnGate, ff));
    }
    Ok(ActivationSizes {
        values,
        logit_rows,
        matmul_inputs,
    })
}

/// KV bytes a decode token reads, averaged over positions `0..context`: a full layer reads
/// every position so far, a sliding-window layer at most its window (and its ring).
pub fn kv_reads(s: &ModelSpec, slots: &[usize], context: usize, row_bytes: usize) -> Result<u64> {
    let c = context as u128;
    let mut sum = 0u128;
    for (l, &n) in s.layers.iter().zip(slots) {
        let w = l.window.map_or(n, |w| w.min(n)) as u128;
        // Σ_{p=0}^{c-1} min(p + 1, w)
        let reads = if w >= c {
            c * (c + 1) / 2
        } else {
            w * (w + 1) / 2 + (c - w) * w
        };
        sum = reads
            .checked_mul(row_bytes as u128)
            .and_then(|r| sum.checked_add(r))
            .ok_or_else(|| overflow("the KV reads"))?;
    }
    u64::try_from(sum / c.max(1)).map_err(|_| overflow("the KV reads"))
}

/// Bytes of a KV buffer of `values` values stored as `kv` (whole f32 words, as the GPU
/// backend allocates), checked.
pub fn kv_buffer_bytes(values: usize, kv: KvType) -> Result<usize> {
    kv.bytes(values)
        .and_then(|b| b.checked_next_multiple_of(4))
        .ok_or_else(|| overflow("the KV cache"))
}
