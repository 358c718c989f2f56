//! The model's shapes (decode's `Rope`, `Attention`, `GateActivation`) as rocm-kernels' launch
//! parameters take them.

use crate::backend::{Attention, GateActivation, Rope};
use rocm_kernels::ops::{attention as attn, elementwise, rope};

/// A layer's rope as the kernels take it.
pub(super) fn rope_kernel_params(rope: &Rope) -> rope::RopeParams {
    rope::RopeParams {
        neox: rope.neox,
        freq_base: rope.freq_base,
        position_scale: rope.position_scale,
        n_rot: rope.n_rot,
    }
}

/// The kernel's view of an attention call's shape.
pub(super) fn attention_shape(shape: &Attention) -> attn::AttentionShape {
    attn::AttentionShape {
        n_tokens: shape.n_tokens,
        n_head: shape.n_head,
        n_head_kv: shape.n_head_kv,
        head_dim_k: shape.head_dim_k,
        head_dim_v: shape.head_dim_v,
        scale: shape.scale,
        window: shape.window,
        slots: shape.kv_slots,
    }
}

pub(super) fn gate_activation(act: GateActivation) -> elementwise::GateActivation {
    match act {
        GateActivation::Silu => elementwise::GateActivation::Silu,
        GateActivation::GeluTanh => elementwise::GateActivation::GeluTanh,
    }
}
