//! Is arm B faster than arm A? The noise rule of `--ab`.
//!
//! The delta is B's median throughput against A's, in percent. It counts as a real difference
//! only when it is larger than the noise band, which is twice the larger of the two arms'
//! relative median absolute deviations, and never narrower than 1 %:
//!
//! ```text
//! delta  = 100 * (median_B - median_A) / median_A
//! noise  = max(1 %, 2 * 100 * max(MAD_A / median_A, MAD_B / median_B))
//! |delta| <= noise -> within noise; delta > noise -> faster; delta < -noise -> slower
//! ```
//!
//! Medians and MADs rather than means and standard deviations, because one run disturbed by
//! something else on the machine moves a mean and inflates a deviation but barely moves either.
//! For normal noise 2 MAD is about 1.35 standard deviations of a single run. The 1 % floor
//! keeps a pair of unusually quiet arms from calling a sub-percent change real: differences
//! that small are below what clock and placement effects reproduce from one session to the
//! next.

use crate::stats::{summarize, StatsError, Summary};
use std::fmt;

/// The narrowest noise band, in percent.
pub const MIN_NOISE_PCT: f64 = 1.0;
/// The noise band is this many relative MADs of the noisier arm.
pub const MAD_FACTOR: f64 = 2.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Faster,
    Slower,
    WithinNoise,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Faster => "faster",
            Verdict::Slower => "slower",
            Verdict::WithinNoise => "within noise",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// B against A.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    /// `100 * (median_B - median_A) / median_A`.
    pub delta_pct: f64,
    /// The half-width of the band inside which a delta is noise, in percent.
    pub noise_pct: f64,
    pub verdict: Verdict,
}

/// Why two arms could not be compared.
#[derive(Clone, Debug, PartialEq)]
pub enum CompareError {
    Samples {
        arm: &'static str,
        error: StatsError,
    },
    /// A summary field that is not finite (a summary built by hand).
    NotFinite {
        arm: &'static str,
        field: &'static str,
    },
    /// A's median is not positive, so a relative delta means nothing.
    NonPositiveBaseline(f64),
}

impl fmt::Display for CompareError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompareError::Samples { arm, error } => write!(f, "arm {arm}: {error}"),
            CompareError::NotFinite { arm, field } => {
                write!(f, "arm {arm}: the {field} is not a finite number")
            }
            CompareError::NonPositiveBaseline(m) => {
                write!(
                    f,
                    "arm A's median is {m}; a relative delta needs a positive one"
                )
            }
        }
    }
}

impl std::error::Error for CompareError {}

fn check(arm: &'static str, s: &Summary) -> Result<(), CompareError> {
    for (field, v) in [("median", s.median), ("MAD", s.mad)] {
        if !v.is_finite() {
            return Err(CompareError::NotFinite { arm, field });
        }
    }
    Ok(())
}

/// Applies the noise rule of the module docs to two summaries.
pub fn compare(a: &Summary, b: &Summary) -> Result<Comparison, CompareError> {
    check("A", a)?;
    check("B", b)?;
    if a.median <= 0.0 {
        return Err(CompareError::NonPositiveBaseline(a.median));
    }
    let delta_pct = 100.0 * (b.median - a.median) / a.median;
    let noise_pct = (MAD_FACTOR * 100.0 * a.rel_mad().max(b.rel_mad())).max(MIN_NOISE_PCT);
    let verdict = if delta_pct.abs() <= noise_pct {
        Verdict::WithinNoise
    } else if delta_pct > 0.0 {
        Verdict::Faster
    } else {
        Verdict::Slower
    };
    Ok(Comparison {
        delta_pct,
        noise_pct,
        verdict,
    })
}

/// Summarizes both arms' samples and compares them.
pub fn compare_samples(a: &[f64], b: &[f64]) -> Result<Comparison, CompareError> {
    let sa = summarize(a).map_err(|error| CompareError::Samples { arm: "A", error })?;
    let sb = summarize(b).map_err(|error| CompareError::Samples { arm: "B", error })?;
    compare(&sa, &sb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clear_gain_is_faster_and_a_clear_loss_slower() {
        let a = [100.0, 101.0, 99.0, 100.0, 100.5];
        let b = [110.0, 111.0, 109.0, 110.0, 110.5];
        let c = compare_samples(&a, &b).unwrap();
        assert_eq!(c.verdict, Verdict::Faster);
        assert!((c.delta_pct - 10.0).abs() < 1e-9, "{}", c.delta_pct);
        assert_eq!(compare_samples(&b, &a).unwrap().verdict, Verdict::Slower);
    }

    #[test]
    fn a_delta_inside_twice_the_noisier_mad_is_noise() {
        // A: median 100, MAD 5 -> 5 %, band 10 %; B is 8 % faster.
        let a = [95.0, 100.0, 105.0, 90.0, 110.0];
        let b = [108.0, 108.0, 108.0];
        let c = compare_samples(&a, &b).unwrap();
        assert!((c.noise_pct - 10.0).abs() < 1e-9, "{}", c.noise_pct);
        assert_eq!(c.verdict, Verdict::WithinNoise);
        // The band is symmetric: the same arms the other way round are noise too.
        assert_eq!(
            compare_samples(&b, &a).unwrap().verdict,
            Verdict::WithinNoise
        );
    }

    #[test]
    fn quiet_arms_still_get_the_one_percent_floor() {
        let c = compare_samples(&[100.0; 4], &[100.9; 4]).unwrap();
        assert_eq!(c.noise_pct, MIN_NOISE_PCT);
        assert_eq!(c.verdict, Verdict::WithinNoise);
        let c = compare_samples(&[100.0; 4], &[101.5; 4]).unwrap();
        assert_eq!(c.verdict, Verdict::Faster);
    }

    #[test]
    fn nan_infinite_empty_and_zero_inputs_are_rejected() {
        let e = compare_samples(&[100.0, f64::NAN], &[100.0]).unwrap_err();
        assert!(matches!(e, CompareError::Samples { arm: "A", .. }), "{e}");
        let e = compare_samples(&[100.0], &[f64::INFINITY]).unwrap_err();
        assert!(matches!(e, CompareError::Samples { arm: "B", .. }), "{e}");
        assert!(compare_samples(&[], &[1.0]).is_err());
        assert!(matches!(
            compare_samples(&[0.0, 0.0], &[1.0]),
            Err(CompareError::NonPositiveBaseline(_))
        ));
        // A hand-built summary with a NaN field is refused too, not passed as "within noise".
        let mut s = summarize(&[100.0, 101.0]).unwrap();
        let good = s;
        s.median = f64::NAN;
        assert!(matches!(
            compare(&good, &s),
            Err(CompareError::NotFinite {
                arm: "B",
                field: "median"
            })
        ));
        s = good;
        s.mad = f64::NAN;
        assert!(compare(&s, &good).is_err());
    }
}
