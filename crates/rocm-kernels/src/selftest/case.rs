//! One entry of the table, and the seeded inputs every group draws from.

use super::rig::Rig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One entry of the table: an op (or a chain of ops) against its CPU reference.
#[derive(Clone, Copy)]
pub struct Case {
    /// What the case checks, as a test name would say it.
    pub name: &'static str,
    /// The op it exercises, the name reports group by and
    /// [`crate::knobs::SELFTEST_BREAK`] takes.
    pub op: &'static str,
    /// Launches the op and records its comparisons on the rig; an error is a failed case.
    pub run: fn(&Rig<'_>) -> crate::Result<()>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name, self.op)
    }
}

/// `n` values uniform in `[lo, hi)`.
pub(crate) fn uniform_vec(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// A generator whose numbers depend only on `seed`.
pub(crate) fn seeded(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}
