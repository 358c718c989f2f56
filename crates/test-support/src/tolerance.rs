//! Comparisons of a float result with its reference that fail on NaN.
//!
//! `f32::max` skips a NaN and every `<=` against one is false, so a comparison written the
//! obvious way lets a NaN result pass any tolerance, or fail with a message that names no
//! position. These helpers refuse NaN (and a length mismatch) up front, naming the first bad
//! index; the tolerances themselves stay with the tests, next to the reason for each.

/// Root mean square of `values` (accumulated in f64); 0 for an empty slice.
pub fn rms(values: &[f32]) -> f32 {
    rms_f64(values.iter().map(|&v| f64::from(v)), values.len()) as f32
}

fn rms_f64(values: impl Iterator<Item = f64>, len: usize) -> f64 {
    if len == 0 {
        return 0.0;
    }
    (values.map(|v| v * v).sum::<f64>() / len as f64).sqrt()
}

fn same_length(got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() == want.len() {
        Ok(())
    } else {
        Err(format!("{} values compared with {}", got.len(), want.len()))
    }
}

/// Largest |got - want| over two slices of equal length. NaN anywhere (in either input, or
/// from inf - inf) is an error naming the first position.
pub fn try_max_abs_diff(got: &[f32], want: &[f32]) -> Result<f32, String> {
    same_length(got, want)?;
    let mut max = 0.0f32;
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let d = (a - b).abs();
        if d.is_nan() {
            return Err(format!("NaN at index {i}: got {a}, want {b}"));
        }
        max = max.max(d);
    }
    Ok(max)
}

/// [`try_max_abs_diff`], failing the test on NaN or a length mismatch.
pub fn max_abs_diff(got: &[f32], want: &[f32]) -> f32 {
    try_max_abs_diff(got, want).unwrap_or_else(|e| panic!("comparison failed: {e}"))
}

/// The largest |got - want| and the reference's RMS, for a bound of `tol * max(1, RMS)`; fails
/// the test as [`max_abs_diff`] does.
pub fn compare(got: &[f32], want: &[f32]) -> (f32, f32) {
    (max_abs_diff(got, want), rms(want))
}

/// The gap between the two largest logits, and the logits' RMS: where two greedy runs part, a
/// gap within a small multiple of the RMS is a near-tie that rounding may flip.
///
/// # Panics
/// With fewer than two logits.
pub fn top2_margin(logits: &[f32]) -> (f32, f32) {
    assert!(logits.len() >= 2, "a margin needs two logits");
    let mut sorted = logits.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    (sorted[0] - sorted[1], rms(logits))
}

/// How far a result is from its reference, in absolute terms and relative to the reference's
/// RMS (the scale a tolerance for a whole tensor is stated in).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RelativeError {
    /// The largest |got - want|.
    pub max_abs: f64,
    /// Where [`Self::max_abs`] is (the first such index).
    pub worst: usize,
    /// RMS of got - want.
    pub rms_abs: f64,
    /// RMS of the reference.
    pub reference_rms: f64,
}

impl RelativeError {
    /// The reference's RMS, or the smallest positive value for an all-zero reference (where
    /// any error at all is then far beyond a tolerance).
    fn scale(&self) -> f64 {
        self.reference_rms.max(f64::MIN_POSITIVE)
    }

    /// [`Self::max_abs`] over the reference's RMS.
    pub fn max_rel(&self) -> f64 {
        self.max_abs / self.scale()
    }

    /// [`Self::rms_abs`] over the reference's RMS.
    pub fn rms_rel(&self) -> f64 {
        self.rms_abs / self.scale()
    }
}

/// The error of `got` against `want` (in f64). An infinity or NaN on either side is an error
/// naming the first such index, as is a length mismatch: a tolerance relative to the RMS means
/// nothing once either is not finite.
pub fn try_relative_error(got: &[f32], want: &[f32]) -> Result<RelativeError, String> {
    same_length(got, want)?;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if !g.is_finite() || !w.is_finite() {
            return Err(format!("non-finite value at index {i}: got {g}, want {w}"));
        }
    }
    let diff = || {
        got.iter()
            .zip(want)
            .map(|(&g, &w)| f64::from(g) - f64::from(w))
    };
    let (worst, max_abs) =
        diff().map(f64::abs).enumerate().fold(
            (0, 0.0),
            |best, (i, d)| if d > best.1 { (i, d) } else { best },
        );
    Ok(RelativeError {
        max_abs,
        worst,
        rms_abs: rms_f64(diff(), got.len()),
        reference_rms: rms_f64(want.iter().map(|&w| f64::from(w)), want.len()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_difference_is_found() {
        assert_eq!(
            try_max_abs_diff(&[1.0, 2.0, 3.0], &[1.0, 2.5, 2.0]),
            Ok(1.0)
        );
        assert_eq!(try_max_abs_diff(&[], &[]), Ok(0.0));
    }

    #[test]
    fn nan_fails_a_comparison_naming_its_index() {
        let err = try_max_abs_diff(&[1.0, f32::NAN, 3.0], &[1.0, 2.0, 3.0]).unwrap_err();
        assert!(err.contains("NaN at index 1"), "{err}");
        let err = try_max_abs_diff(&[1.0, 2.0], &[1.0, f32::NAN]).unwrap_err();
        assert!(err.contains("index 1"), "{err}");
        let err = try_max_abs_diff(&[f32::INFINITY], &[f32::INFINITY]).unwrap_err();
        assert!(err.contains("index 0"), "inf - inf is NaN: {err}");
    }

    #[test]
    fn a_nan_after_a_large_difference_still_fails() {
        // f32::max(NaN) keeps the running maximum, so a NaN late in the row is the case that
        // a plain fold lets through.
        assert!(try_max_abs_diff(&[0.0, 5.0, f32::NAN], &[0.0, 0.0, 0.0]).is_err());
    }

    #[test]
    fn a_wrong_length_fails_a_comparison() {
        let err = try_max_abs_diff(&[1.0, 2.0], &[1.0]).unwrap_err();
        assert!(err.contains("2 values compared with 1"), "{err}");
        assert!(try_relative_error(&[1.0], &[1.0, 2.0]).is_err());
    }

    #[test]
    #[should_panic(expected = "NaN at index 0")]
    fn max_abs_diff_fails_the_test_on_nan() {
        max_abs_diff(&[f32::NAN], &[0.0]);
    }

    #[test]
    #[should_panic(expected = "NaN at index 2")]
    fn compare_fails_the_test_on_nan() {
        compare(&[1.0, 2.0, f32::NAN], &[1.0, 2.0, 3.0]);
    }

    #[test]
    #[should_panic(expected = "3 values compared with 2")]
    fn compare_fails_the_test_on_a_wrong_length() {
        compare(&[0.0; 3], &[0.0; 2]);
    }

    #[test]
    fn compare_gives_the_reference_rms() {
        let (max, rms) = compare(&[3.0, -4.0], &[3.0, -3.0]);
        assert_eq!(max, 1.0);
        assert_eq!(rms, 3.0);
    }

    #[test]
    fn the_margin_is_between_the_two_largest_logits() {
        // The largest magnitude (-3) is not one of the two largest logits.
        let (gap, rms) = top2_margin(&[1.0, 3.0, -3.0, -1.0]);
        assert_eq!(gap, 2.0);
        assert!((rms - 5f32.sqrt()).abs() < 1e-6, "{rms}");
    }

    #[test]
    fn relative_errors_are_over_the_reference_rms() {
        let e = try_relative_error(&[1.0, 2.0, 2.0, 4.0], &[2.0, 2.0, 2.0, 2.0]).unwrap();
        assert_eq!((e.max_abs, e.worst), (2.0, 3));
        assert_eq!(e.reference_rms, 2.0);
        assert_eq!(e.max_rel(), 1.0);
        assert_eq!(e.rms_abs, (5.0f64 / 4.0).sqrt());
        assert_eq!(e.rms_rel(), (5.0f64 / 4.0).sqrt() / 2.0);
    }

    #[test]
    fn any_error_against_an_all_zero_reference_is_far_out_of_tolerance() {
        assert_eq!(try_relative_error(&[0.0], &[0.0]).unwrap().max_rel(), 0.0);
        assert!(try_relative_error(&[1e-6], &[0.0]).unwrap().max_rel() > 1e30);
    }

    #[test]
    fn a_non_finite_value_fails_a_relative_comparison_naming_its_index() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let err = try_relative_error(&[1.0, bad], &[1.0, 1.0]).unwrap_err();
            assert!(err.contains("index 1"), "{err}");
            let err = try_relative_error(&[1.0, 1.0], &[bad, 1.0]).unwrap_err();
            assert!(err.contains("index 0"), "{err}");
        }
    }
}
