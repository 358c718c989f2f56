//! CPU reference of causal attention against a K/V cache: the decode crate's `attention` with a
//! position per query token and a cache in f16, f32 or q8_0, in f32.

use crate::error::{check_shape, Result};
use crate::ops::attention::{check, check_cache_elem, AttentionShape};
use crate::reference::kv_cache::{cache_row, HostKv, HostPages};

/// Writes `[n_tokens][n_head][head_dim_v]` to `out`; see [`crate::ops::attention`]. Errors on
/// the shapes the GPU op refuses, on a negative position, and (paged) on a slot whose block is
/// outside the tables or the cache.
pub fn attention(
    q: &[f32],
    k: HostKv<'_>,
    v: HostKv<'_>,
    positions: &[i32],
    pages: Option<&HostPages<'_>>,
    out: &mut [f32],
    shape: &AttentionShape,
) -> Result<()> {
    check(
        q.len(),
        k.len(),
        v.len(),
        positions.len(),
        out.len(),
        shape,
        pages.is_some(),
    )?;
    check_shape(k.elem() == v.elem(), "attention reference", || {
        format!(
            "the K cache is {:?} but the V cache is {:?}",
            k.elem(),
            v.elem()
        )
    })?;
    // Host memory has no device alignment to keep: only the element type's shape rules apply.
    check_cache_elem(k.elem(), 0, 0, shape)?;
    let cache_rows = (k.len() / (shape.n_head_kv * shape.head_dim_k))
        .min(v.len() / (shape.n_head_kv * shape.head_dim_v));
    let row_of = |t, slot| cache_row("attention reference", pages, t, slot, cache_rows);
    check_shape(
        positions[..shape.n_tokens].iter().all(|&p| p >= 0),
        "attention reference",
        || "negative position".to_string(),
    )?;
    let (dk, dv) = (shape.head_dim_k, shape.head_dim_v);
    let group = shape.n_head / shape.n_head_kv;
    let mut scores = Vec::new();
    for t in 0..shape.n_tokens {
        let pos = positions[t] as usize;
        let first = shape.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        for h in 0..shape.n_head {
            let kvh = h / group;
            let qh = &q[(t * shape.n_head + h) * dk..][..dk];
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for j in first..=pos {
                let base = (row_of(t, j % shape.slots)? * shape.n_head_kv + kvh) * dk;
                let dot: f32 = qh
                    .iter()
                    .enumerate()
                    .map(|(d, &x)| x * k.get(base + d))
                    .sum();
                let s = shape.cap_score(dot * shape.scale);
                max = max.max(s);
                scores.push(s);
            }
            let mut sum = 0.0;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            let o = &mut out[(t * shape.n_head + h) * dv..][..dv];
            o.fill(0.0);
            for (s, j) in scores.iter().zip(first..=pos) {
                let base = (row_of(t, j % shape.slots)? * shape.n_head_kv + kvh) * dv;
                let w = s / sum;
                for (d, ov) in o.iter_mut().enumerate() {
                    *ov += w * v.get(base + d);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(window: Option<usize>, slots: usize) -> AttentionShape {
        AttentionShape {
            n_tokens: 1,
            n_head: 1,
            n_head_kv: 1,
            head_dim_k: 2,
            head_dim_v: 2,
            scale: 1.0,
            softcap: None,
            window,
            slots,
        }
    }

    #[test]
    fn one_key_returns_its_value_window_limits_keys_and_ring_slots_wrap() {
        // The decode crate's hand-checked case, with positions on the "device".
        let k = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let q = [0.3, -0.2];
        let mut out = [0.0; 2];
        attention(
            &q,
            HostKv::F32(&k),
            HostKv::F32(&v),
            &[0],
            None,
            &mut out,
            &shape(None, 3),
        )
        .unwrap();
        assert_eq!(out, [1.0, 2.0]);
        let s = shape(Some(1), 3);
        attention(
            &q,
            HostKv::F32(&k),
            HostKv::F32(&v),
            &[2],
            None,
            &mut out,
            &s,
        )
        .unwrap();
        assert_eq!(out, [5.0, 6.0]);
        attention(
            &q,
            HostKv::F32(&k),
            HostKv::F32(&v),
            &[2],
            None,
            &mut out,
            &shape(None, 3),
        )
        .unwrap();
        let e: Vec<f32> = [0.3f32, -0.2, 0.1].iter().map(|x| x.exp()).collect();
        let want0 = (e[0] + e[1] * 3.0 + e[2] * 5.0) / (e[0] + e[1] + e[2]);
        assert!((out[0] - want0).abs() < 1e-5);
        // Two-slot ring: position 2 is in slot 0, position 1 in slot 1.
        let k2 = [1.0, 1.0, 0.0, 1.0];
        let v2 = [5.0, 6.0, 3.0, 4.0];
        let s = shape(Some(2), 2);
        attention(
            &q,
            HostKv::F32(&k2),
            HostKv::F32(&v2),
            &[2],
            None,
            &mut out,
            &s,
        )
        .unwrap();
        let (e1, e2) = ((-0.2f32).exp(), 0.1f32.exp());
        let want = (e1 * 3.0 + e2 * 5.0) / (e1 + e2);
        assert!((out[0] - want).abs() < 1e-5, "{} vs {want}", out[0]);
    }

    #[test]
    fn grouped_heads_read_their_kv_head_and_f16_caches_read_through_half() {
        // Two query heads, one KV head, one key: both heads return that value exactly.
        let mut s = shape(None, 1);
        s.n_head = 2;
        let q = [1.0, 2.0, -1.0, 0.5];
        let k: Vec<u16> = [0.5f32, 0.25]
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect();
        let v: Vec<u16> = [3.0f32, -2.5]
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect();
        let mut out = [0.0; 4];
        attention(
            &q,
            HostKv::F16(&k),
            HostKv::F16(&v),
            &[0],
            None,
            &mut out,
            &s,
        )
        .unwrap();
        assert_eq!(out, [3.0, -2.5, 3.0, -2.5]);
        // Two KV heads for four query heads: heads 0, 1 read KV head 0, heads 2, 3 KV head 1.
        s.n_head = 4;
        s.n_head_kv = 2;
        let q = [0.0; 8];
        let k = [0.0f32; 4];
        let v = [1.0f32, 2.0, 3.0, 4.0];
        let mut out = [0.0; 8];
        attention(
            &q,
            HostKv::F32(&k),
            HostKv::F32(&v),
            &[0],
            None,
            &mut out,
            &s,
        )
        .unwrap();
        assert_eq!(out, [1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0]);
    }
}
