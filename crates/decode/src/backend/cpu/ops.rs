//! The f32 math of the CPU backend that rocm-kernels' CPU references do not cover as it needs
//! them: attention parallel over query heads (on the matrix kernels' dot product), and the
//! router's softmax. Norms, rotary embedding and gates are the references' own.

use crate::backend::Attention;
use rayon::prelude::*;

/// Causal (optionally windowed) attention with grouped KV heads, parallel over query heads.
/// Query row t is at position `rows[t].0` of the sequence whose block table is `rows[t].1`:
/// position p is in its slot `s = p % a.slots`, which is cache row `table[s / block] * block +
/// s % block`. The caller has checked that every block a row reads is in the caches.
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    a: &Attention,
    rows: &[(usize, &[u32])],
    block: usize,
) {
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
            let (pos, table) = rows[t];
            let row = |j: usize| {
                let slot = j % a.slots;
                table[slot / block] as usize * block + slot % block
            };
            let first = match a.window {
                Some(w) => (pos + 1).saturating_sub(w),
                None => 0,
            };
            let qh = &q[t * q_stride + h * a.head_dim_k..][..a.head_dim_k];
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for j in first..=pos {
                let kj = &k[row(j) * kv_stride_k + kvh * a.head_dim_k..][..a.head_dim_k];
                let s = a.cap_score(super::kernels::dot_f32_slice(qh, kj) * a.scale);
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
                let vj = &v[row(j) * kv_stride_v + kvh * a.head_dim_v..][..a.head_dim_v];
                let wgt = s / sum;
                for (ov, &vv) in o.iter_mut().zip(vj) {
                    *ov += wgt * vv;
                }
            }
        });
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
            softcap: None,
            window: None,
            slots: 3,
        };
        let mut out = [0.0; 2];
        attention(&q, &k, &v, &mut out, &shape, &[(pos0, &[0])], 4);
        assert_eq!(out, [1.0, 2.0]);
        pos0 = 2;
        shape.window = Some(1);
        attention(&q, &k, &v, &mut out, &shape, &[(pos0, &[0])], 4);
        assert_eq!(out, [5.0, 6.0]);
        // Full causal at position 2: softmax-weighted mean of all three values.
        shape.window = None;
        attention(&q, &k, &v, &mut out, &shape, &[(pos0, &[0])], 4);
        let s = [0.3f32, -0.2, 0.1];
        let e: Vec<f32> = s.iter().map(|x| x.exp()).collect();
        let z: f32 = e.iter().sum();
        let want0 = (e[0] * 1.0 + e[1] * 3.0 + e[2] * 5.0) / z;
        assert!((out[0] - want0).abs() < 1e-5);
        // A two-slot ring: position 2 lives in slot 0; with window 2, position 2 sees
        // positions 1 (slot 1) and 2 (slot 0).
        shape.slots = 2;
        shape.window = Some(2);
        let k2 = [1.0, 1.0, 0.0, 1.0];
        let v2 = [5.0, 6.0, 3.0, 4.0];
        attention(&q, &k2, &v2, &mut out, &shape, &[(pos0, &[0])], 2);
        let (e1, e2) = ((-0.2f32).exp(), 0.1f32.exp());
        let want = (e1 * 3.0 + e2 * 5.0) / (e1 + e2);
        assert!((out[0] - want).abs() < 1e-5, "{} vs {want}", out[0]);
    }

    #[test]
    fn each_row_reads_only_its_own_sequences_blocks() {
        // Two sequences of one block of two slots each, sequence 0 in block 1 and sequence 1
        // in block 0; one head of dim 1. Sequence 0 holds values 1, 2 and sequence 1 holds 10,
        // 20 at positions 0, 1.
        let k = [0.0; 4];
        let v = [10.0, 20.0, 1.0, 2.0];
        let q = [0.0, 0.0];
        let shape = Attention {
            n_tokens: 2,
            n_head: 1,
            n_head_kv: 1,
            head_dim_k: 1,
            head_dim_v: 1,
            scale: 1.0,
            softcap: None,
            window: None,
            slots: 2,
        };
        let mut out = [0.0; 2];
        // Row 0: sequence 1 at position 0; row 1: sequence 0 at position 1. Equal scores, so
        // each output is the mean of the values its row sees.
        attention(&q, &k, &v, &mut out, &shape, &[(0, &[0]), (1, &[1])], 2);
        assert_eq!(out, [10.0, 1.5]);
    }
}
