//! The generator tests draw their inputs from: `StdRng` seeded with a fixed number, so a test
//! sees the same inputs on every run and machine, and a failure reproduces.
//!
//! The stream of numbers is fixed by the `rand` version in `Cargo.lock`; a `rand` upgrade may
//! change it, which is why tests assert properties of their results, never values drawn here.
//! (`rocm-alloc`'s `h200_compare` example keeps its own generator: it must draw exactly what a
//! C++ harness draws.)

use rand::{Rng, SeedableRng};

pub use rand::rngs::StdRng;

/// A generator whose numbers depend only on `seed`.
pub fn seeded(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `n` values uniform in `[lo, hi)`.
///
/// # Panics
/// When the range is empty (`lo >= hi`) or not finite.
pub fn uniform_vec(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_values_and_another_seed_others() {
        let draw = |seed| uniform_vec(&mut seeded(seed), 64, -1.0, 1.0);
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn uniform_values_stay_in_their_range_and_spread_over_it() {
        let values = uniform_vec(&mut seeded(1), 10_000, -3.0, 5.0);
        assert!(values.iter().all(|v| (-3.0..5.0).contains(v)));
        let min = values.iter().copied().fold(f32::INFINITY, f32::min);
        let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert!(min < -2.9 && max > 4.9, "{min}..{max}");
    }
}
