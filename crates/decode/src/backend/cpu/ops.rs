//! Plain f32 math the CPU backend is built from: norms, rotary embedding, attention, gates.

use crate::backend::{Attention, GateActivation, Rope};
use rayon::prelude::*;

/// RMSNorm of one vector.
pub fn rms_norm(x: &[f32], w: &[f32], out: &mut [f32], eps: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ss + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

/// Rotates one head in place at position `pos`.
pub fn rope_head(x: &mut [f32], pos: usize, rope: &Rope, freq_factors: Option<&[f32]>) {
    let n_rot = rope.n_rot;
    let p = pos as f32 / rope.position_scale;
    let half = n_rot / 2;
    for i in 0..half {
        let mut theta = p * rope.freq_base.powf(-2.0 * i as f32 / n_rot as f32);
        if let Some(f) = freq_factors {
            theta /= f[i];
        }
        let (s, c) = theta.sin_cos();
        let (a, b) = if rope.neox {
            (i, i + half)
        } else {
            (2 * i, 2 * i + 1)
        };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

/// Causal (optionally windowed) attention with grouped KV heads, parallel over query heads.
/// Query row t is at position `pos0 + t`.
pub fn attention(q: &[f32], k: &[f32], v: &[f32], out: &mut [f32], a: &Attention, pos0: usize) {
    let q_stride = a.n_head * a.head_dim_k;
    let kv_stride_k = a.n_head_kv * a.head_dim_k;
    let kv_stride_v = a.n_head_kv * a.head_dim_v;
    let group = a.n_head / a.n_head_kv;
    out[..a.n_tokens * a.n_head * a.head_dim_v]
        .par_chunks_mut(a.head_dim_v)
        .enumerate()
        .for_each_init(Vec::new, |scores: &mut Vec<f32>, (idx, o)| {
            let (t, h) = (idx / a.n_head, idx % a.n_head);
            let kvh = h / group;
            let pos = pos0 + t;
            let first = match a.window {
                Some(w) => (pos + 1).saturating_sub(w),
                None => 0,
            };
            let qh = &q[t * q_stride + h * a.head_dim_k..][..a.head_dim_k];
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for j in first..=pos {
                let slot = j % a.kv_slots;
                let kj = &k[slot * kv_stride_k + kvh * a.head_dim_k..][..a.head_dim_k];
                let s = super::kernels::dot_f32_slice(qh, kj) * a.scale;
                max = max.max(s);
                scores.push(s);
            }
            let mut sum = 0.0;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            o.fill(0.0);
            for (s, j) in scores.iter().zip(first..=pos) {
                let vj = &v[(j % a.kv_slots) * kv_stride_v + kvh * a.head_dim_v..][..a.head_dim_v];
                let wgt = s / sum;
                for (ov, &vv) in o.iter_mut().zip(vj) {
                    *ov += wgt * vv;
                }
            }
        });
}

/// `gate = act(gate) * up`.
pub fn gated(gate: &mut [f32], up: &[f32], act: GateActivation) {
    match act {
        GateActivation::Silu => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = *g / (1.0 + (-*g).exp()) * u;
            }
        }
        GateActivation::GeluTanh => {
            const SQRT_2_OVER_PI: f32 = 0.797_884_6;
            for (g, &u) in gate.iter_mut().zip(up) {
                let x = *g;
                let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
                *g = 0.5 * x * (1.0 + inner.tanh()) * u;
            }
        }
    }
}

/// Softmax in place.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_preserves_norm_and_is_identity_at_zero() {
        let rope = Rope {
            neox: true,
            freq_base: 10000.0,
            position_scale: 1.0,
            n_rot: 8,
        };
        let x0: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let mut x = x0.clone();
        rope_head(&mut x, 0, &rope, None);
        assert_eq!(x, x0);
        rope_head(&mut x, 7, &rope, None);
        let n0: f32 = x0.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-3);
        // Pair (0, 4) rotates by angle 7 at frequency 1.
        let (s, c) = 7f32.sin_cos();
        assert!((x[0] - (x0[0] * c - x0[4] * s)).abs() < 1e-5);
    }

    #[test]
    fn attention_with_one_key_returns_its_value_and_window_limits_keys() {
        // One head, dim 2, three cached positions.
        let k = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let q = [0.3, -0.2];
        let mut pos0 = 0;
        let mut shape = Attention {
            n_tokens: 1,
            n_head: 1,
            n_head_kv: 1,
            head_dim_k: 2,
            head_dim_v: 2,
            scale: 1.0,
            window: None,
            kv_slots: 3,
        };
        let mut out = [0.0; 2];
        attention(&q, &k, &v, &mut out, &shape, pos0);
        assert_eq!(out, [1.0, 2.0]);
        pos0 = 2;
        shape.window = Some(1);
        attention(&q, &k, &v, &mut out, &shape, pos0);
        assert_eq!(out, [5.0, 6.0]);
        // Full causal at position 2: softmax-weighted mean of all three values.
        shape.window = None;
        attention(&q, &k, &v, &mut out, &shape, pos0);
        let s = [0.3f32, -0.2, 0.1];
        let e: Vec<f32> = s.iter().map(|x| x.exp()).collect();
        let z: f32 = e.iter().sum();
        let want0 = (e[0] * 1.0 + e[1] * 3.0 + e[2] * 5.0) / z;
        assert!((out[0] - want0).abs() < 1e-5);
        // A two-slot ring: position 2 lives in slot 0; with window 2, position 2 sees
        // positions 1 (slot 1) and 2 (slot 0).
        shape.kv_slots = 2;
        shape.window = Some(2);
        let k2 = [1.0, 1.0, 0.0, 1.0];
        let v2 = [5.0, 6.0, 3.0, 4.0];
        attention(&q, &k2, &v2, &mut out, &shape, pos0);
        let (e1, e2) = ((-0.2f32).exp(), 0.1f32.exp());
        let want = (e1 * 3.0 + e2 * 5.0) / (e1 + e2);
        assert!((out[0] - want).abs() < 1e-5, "{} vs {want}", out[0]);
    }

    #[test]
    fn gelu_tanh_and_silu_match_their_formulas_at_known_points() {
        let mut g = [1.0f32, -1.0];
        gated(&mut g, &[2.0, 1.0], GateActivation::Silu);
        assert!((g[0] - 2.0 * 0.731_058_6).abs() < 1e-5);
        assert!((g[1] - (-0.268_941_43)).abs() < 1e-5);
        let mut g = [1.0f32];
        gated(&mut g, &[1.0], GateActivation::GeluTanh);
        assert!((g[0] - 0.841_192).abs() < 1e-5);
    }
}
