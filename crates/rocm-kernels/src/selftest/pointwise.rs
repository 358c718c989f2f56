//! Norms, elementwise ops and sampling against the reference, at odd and real shapes.

use super::{Case, Rig};
use crate::ops::norm;
use crate::reference;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// `n` values uniform in `[lo, hi)`.
pub(super) fn uniform_vec(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// A generator whose numbers depend only on `seed`.
pub(super) fn seeded(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub const CASES: &[Case] = &[Case {
    name: "rms_norm_matches_the_reference_out_of_place_and_in_place",
    op: "rms_norm",
    run: rms_norm_out_of_place_and_in_place,
}];

const DIMS: [usize; 10] = [1, 7, 64, 128, 256, 257, 640, 1152, 2051, 4096];
const ROWS: [usize; 3] = [1, 3, 17];

// Norm: the GPU sums squares in another order than the CPU, so 2e-5 relative (f32 sums of up
// to 4096 squares) plus 1e-6 absolute.
const NORM_REL: f32 = 2e-5;
const NORM_ABS: f32 = 1e-6;

fn rms_norm_out_of_place_and_in_place(rig: &Rig<'_>) -> crate::Result<()> {
    let (k, s) = (rig.kernels(), rig.stream());
    let mut rng = seeded(1);
    for dim in DIMS {
        for rows in ROWS {
            let x = uniform_vec(&mut rng, rows * dim, -3.0, 3.0);
            let w = uniform_vec(&mut rng, dim, 0.5, 14.0);
            let eps = 1e-6;
            let mut want = vec![0.0; rows * dim];
            reference::norm::rms_norm(&x, &w, &mut want, rows, dim, eps)?;
            let (xb, wb) = (rig.upload(&x)?, rig.upload(&w)?);
            let ob = rig.upload(&vec![f32::NAN; rows * dim])?;
            norm::rms_norm(
                k,
                s,
                rig.view(&xb, x.len())?,
                rig.view(&wb, dim)?,
                &mut rig.view_mut(&ob, x.len())?,
                rows,
                dim,
                eps,
            )?;
            let got = rig.download(&ob, x.len())?;
            rig.close(
                &format!("rms_norm rows {rows} dim {dim}"),
                &got,
                &want,
                NORM_REL,
                NORM_ABS,
            );
            norm::rms_norm_inplace(
                k,
                rig.stream(),
                &mut rig.view_mut(&xb, x.len())?,
                rig.view(&wb, dim)?,
                rows,
                dim,
                eps,
            )?;
            let got = rig.download(&xb, x.len())?;
            rig.close(
                &format!("rms_norm_inplace rows {rows} dim {dim}"),
                &got,
                &want,
                NORM_REL,
                NORM_ABS,
            );
        }
    }
    Ok(())
}
