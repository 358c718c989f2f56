//! CPU reference of rotary position embedding: the decode crate's `rope_head` with a position
//! per row, in f32 with the same operations in the same order.

use crate::error::Result;
use crate::ops::rope::{check, RopeParams, RopeShape};

/// Rotates `x` (`[rows][n_heads][head_dim]`) in place, row r at `positions[r]`; see
/// [`crate::ops::rope`]. Errors on the shapes the GPU op refuses.
pub fn rope(
    x: &mut [f32],
    positions: &[i32],
    freq_factors: Option<&[f32]>,
    shape: RopeShape,
    params: &RopeParams,
) -> Result<()> {
    check(
        x.len(),
        positions.len(),
        freq_factors.map(<[f32]>::len),
        shape,
        params,
    )?;
    let n_rot = params.n_rot;
    let half = n_rot / 2;
    let row_len = shape.n_heads * shape.head_dim;
    for (row, &pos) in x
        .chunks_exact_mut(row_len.max(1))
        .take(shape.rows)
        .zip(positions)
    {
        let p = pos as f32 / params.position_scale;
        for i in 0..half {
            let mut theta = p * params.freq_base.powf(-2.0 * i as f32 / n_rot as f32);
            if let Some(f) = freq_factors {
                theta /= f[i];
            }
            let (s, c) = theta.sin_cos();
            let (a, b) = if params.neox {
                (i, i + half)
            } else {
                (2 * i, 2 * i + 1)
            };
            for head in row.chunks_exact_mut(shape.head_dim) {
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c - x1 * s;
                head[b] = x0 * s + x1 * c;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(neox: bool, n_rot: usize) -> RopeParams {
        RopeParams {
            neox,
            freq_base: 10_000.0,
            position_scale: 1.0,
            n_rot,
        }
    }

    #[test]
    fn position_zero_is_the_identity_and_pairs_turn_by_their_angle() {
        let shape = RopeShape {
            rows: 2,
            n_heads: 1,
            head_dim: 4,
        };
        let mut x = [1.0, 2.0, 3.0, 4.0, 1.0, 0.0, 1.0, 0.0];
        rope(&mut x, &[0, 1], None, shape, &params(false, 4)).unwrap();
        assert_eq!(&x[..4], &[1.0, 2.0, 3.0, 4.0]);
        // Position 1, pair 0 turns by 1 rad, pair 1 by 10000^(-1/2) = 0.01 rad.
        let (s0, c0) = 1.0f32.sin_cos();
        let (s1, c1) = 0.01f32.sin_cos();
        let want = [c0, s0, c1, s1];
        for (got, want) in x[4..].iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
    }

    #[test]
    fn neox_pairs_the_halves_and_dims_past_n_rot_pass_through() {
        let shape = RopeShape {
            rows: 1,
            n_heads: 2,
            head_dim: 6,
        };
        // n_rot = 4: pairs (0, 2) and (1, 3); dims 4 and 5 untouched, in both heads.
        let mut x = [1.0, 0.0, 0.0, 1.0, 7.0, 8.0, 1.0, 0.0, 0.0, 1.0, 7.0, 8.0];
        let mut p = params(true, 4);
        p.position_scale = 2.0; // position 4 acts as 2
        let factors = [1.0, 0.5]; // pair 1 turns half as fast: 2 * 0.01 / 0.5
        rope(&mut x, &[4], Some(&factors), shape, &p).unwrap();
        let (s0, c0) = 2.0f32.sin_cos();
        let (s1, c1) = 0.04f32.sin_cos();
        let want = [c0, -s1, s0, c1, 7.0, 8.0];
        for head in x.chunks_exact(6) {
            for (got, want) in head.iter().zip(want) {
                assert!((got - want).abs() < 1e-6, "{got} vs {want}");
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let shape = RopeShape {
            rows: 1,
            n_heads: 1,
            head_dim: 4,
        };
        let mut x = [0.0; 4];
        assert!(rope(&mut x, &[0], None, shape, &params(false, 3)).is_err());
        assert!(rope(&mut x, &[0], None, shape, &params(false, 6)).is_err());
        assert!(rope(&mut x, &[], None, shape, &params(false, 4)).is_err());
        assert!(rope(&mut x, &[0], Some(&[1.0]), shape, &params(false, 4)).is_err());
        assert!(rope(&mut x[..3], &[0], None, shape, &params(false, 4)).is_err());
    }
}
