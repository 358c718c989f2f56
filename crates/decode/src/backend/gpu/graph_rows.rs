//! Which row counts decode graphs are captured for.
//!
//! A server's decode steps carry a row per running sequence, a count that changes whenever a
//! sequence joins or leaves. Keyed by the exact count, a server of 64 slots would capture up
//! to 64 graphs, each an eager step plus an instantiation the first time its count comes up.
//! Keyed by [`bucket`], it captures at most a dozen, and a step of fewer rows is padded up to
//! its bucket (`StepBatch::padded_to`): the padding rows run every op, store no keys or values
//! (their sequence id on the device is -1, which the KV stores skip) and their logits are
//! never read.
//!
//! Padding costs work, so the buckets follow the products' costs: up to
//! [`EXACT_UP_TO`] rows the int8 matrix-vector kernels take a step, and their time grows with
//! every row, so each count is its own bucket; above it the matrix-core kernel works in tiles
//! of 16 token rows, which a padded step fills at little extra cost, and past 64 rows (the
//! vendor GEMM, whose time depends little on the rows) buckets are 64 rows apart.

use knobs::{Knob, Scope};

/// Row counts up to this one are captured exactly.
pub const EXACT_UP_TO: usize = 8;
/// Bucket width from [`EXACT_UP_TO`] to [`FINE_UP_TO`] rows: the matrix-core kernel's tile
/// of token rows.
const FINE_STEP: usize = 16;
const FINE_UP_TO: usize = 64;
/// Bucket width past [`FINE_UP_TO`] rows.
const COARSE_STEP: usize = 64;

/// How decode graphs are keyed by their rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphRows {
    /// A few buckets of row counts, steps padded up to theirs ([`bucket`]).
    Buckets,
    /// One graph per row count, no padding.
    Exact,
}

pub static GRAPH_ROWS: Knob<GraphRows> = Knob {
    name: "HIPDECODE_GPU_GRAPH_ROWS",
    default: "buckets",
    doc: "which row counts decode graphs are captured for: `buckets` (every count up to 8, \
          then multiples of 16 up to 64 and of 64 beyond; a step is padded up to its bucket, \
          so a server captures a dozen graphs) or `exact` (a graph per row count, no \
          padding)",
    scope: Scope::Run,
    parse: |v| {
        knobs::parse::choice(
            v,
            &[("buckets", GraphRows::Buckets), ("exact", GraphRows::Exact)],
        )
    },
};

/// The bucket of a decode step of `rows` rows: the row count its graph is captured for.
pub fn bucket(rows: usize) -> usize {
    let round_up = |step: usize| rows.div_ceil(step).saturating_mul(step);
    match rows {
        0..=EXACT_UP_TO => rows,
        r if r <= FINE_UP_TO => round_up(FINE_STEP),
        _ => round_up(COARSE_STEP),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_exact_up_to_eight_then_tiles_of_sixteen_then_sixty_four() {
        let up_to_eight: Vec<usize> = (0..=8).map(bucket).collect();
        assert_eq!(up_to_eight, (0..=8).collect::<Vec<_>>());
        assert_eq!(
            [9, 16, 17, 33, 48, 49, 64].map(bucket),
            [16, 16, 32, 48, 48, 64, 64]
        );
        assert_eq!([65, 128, 129, 300].map(bucket), [128, 128, 192, 320]);
    }

    #[test]
    fn every_row_count_fits_its_bucket_and_few_buckets_cover_a_server() {
        for rows in 0..1000 {
            let b = bucket(rows);
            assert!(b >= rows && bucket(b) == b, "{rows} rows: bucket {b}");
        }
        let mut buckets: Vec<usize> = (1..=64).map(bucket).collect();
        buckets.dedup();
        assert_eq!(buckets.len(), 12, "{buckets:?}");
    }
}
