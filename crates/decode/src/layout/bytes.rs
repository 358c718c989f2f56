//! Checked byte arithmetic for the layout: a size that overflows is an error naming the buffer,
//! never a wrapped count or a panic.

use crate::error::{DecodeError, Result};

/// The error for a byte count of `what` that does not fit.
pub fn overflow(what: &str) -> DecodeError {
    DecodeError::Allocation {
        what: what.to_string(),
        reason: "the byte count overflows".into(),
    }
}

/// The product of `factors`, or an error naming `what`.
pub fn product(what: &str, factors: &[usize]) -> Result<usize> {
    factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .ok_or_else(|| overflow(what))
}

/// The sum of `terms`, or an error naming `what`.
pub fn sum(what: &str, terms: impl IntoIterator<Item = u64>) -> Result<u64> {
    terms
        .into_iter()
        .try_fold(0u64, |acc, t| acc.checked_add(t))
        .ok_or_else(|| overflow(what))
}
