//! Summary statistics of a set of throughput samples (tokens per second).
//!
//! Every entry point refuses an empty set and any value that is not finite, so a NaN from a
//! zero-length timing or a broken child run surfaces as an error instead of a number that
//! compares false with everything (and would read as "within noise").

use std::fmt;

/// Why a set of samples could not be summarized.
#[derive(Clone, Debug, PartialEq)]
pub enum StatsError {
    Empty,
    NotFinite { index: usize, value: f64 },
}

impl fmt::Display for StatsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatsError::Empty => write!(f, "no samples to summarize"),
            StatsError::NotFinite { index, value } => {
                write!(f, "sample {index} is {value}, not a finite number")
            }
        }
    }
}

impl std::error::Error for StatsError {}

/// Mean, sample standard deviation, median, range and median absolute deviation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    /// Sample standard deviation (n - 1 in the denominator); 0 for a single sample, as
    /// llama-bench prints it, so the JSON stays free of NaN.
    pub sd: f64,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Median of `|x - median|`: a spread that one outlier run does not move.
    pub mad: f64,
}

impl Summary {
    /// `mad / median`, the spread as a fraction of the typical value (0 when the median is 0).
    pub fn rel_mad(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            self.mad / self.median.abs()
        }
    }
}

fn check(samples: &[f64]) -> Result<(), StatsError> {
    if samples.is_empty() {
        return Err(StatsError::Empty);
    }
    match samples.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(StatsError::NotFinite {
            index,
            value: samples[index],
        }),
        None => Ok(()),
    }
}

/// The median of finite samples (the mean of the middle two for an even count).
pub fn median(samples: &[f64]) -> Result<f64, StatsError> {
    check(samples)?;
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Ok(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// Summarizes finite samples.
pub fn summarize(samples: &[f64]) -> Result<Summary, StatsError> {
    check(samples)?;
    let n = samples.len();
    let mean = samples.iter().sum::<f64>() / n as f64;
    let sd = if n < 2 {
        0.0
    } else {
        let ss: f64 = samples.iter().map(|x| (x - mean) * (x - mean)).sum();
        (ss / (n - 1) as f64).sqrt()
    };
    let med = median(samples)?;
    let deviations: Vec<f64> = samples.iter().map(|x| (x - med).abs()).collect();
    Ok(Summary {
        n,
        mean,
        sd,
        median: med,
        min: samples.iter().copied().fold(f64::INFINITY, f64::min),
        max: samples.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        mad: median(&deviations)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn summary_of_a_known_set() {
        // mean 5, sample variance 32/7, median 4.5, deviations from 4.5: 2.5 0.5 0.5 0.5 0.5
        // 0.5 1.5 4.5 -> MAD 0.5.
        let s = summarize(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
        assert_eq!(s.n, 8);
        assert!(close(s.mean, 5.0));
        assert!(close(s.sd, (32.0f64 / 7.0).sqrt()), "{}", s.sd);
        assert!(close(s.median, 4.5));
        assert!(close(s.mad, 0.5));
        assert!(close(s.rel_mad(), 0.5 / 4.5));
        assert_eq!((s.min, s.max), (2.0, 9.0));
    }

    #[test]
    fn median_of_odd_and_even_counts_and_order_does_not_matter() {
        assert_eq!(median(&[5.0, 1.0, 3.0]).unwrap(), 3.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]).unwrap(), 2.5);
    }

    #[test]
    fn one_sample_has_zero_spread() {
        let s = summarize(&[42.0]).unwrap();
        assert_eq!((s.mean, s.sd, s.median, s.mad), (42.0, 0.0, 42.0, 0.0));
    }

    #[test]
    fn mad_ignores_one_outlier_where_sd_does_not() {
        let s = summarize(&[100.0, 101.0, 99.0, 100.0, 10.0]).unwrap();
        assert!(close(s.median, 100.0));
        assert!(close(s.mad, 1.0));
        assert!(s.sd > 30.0);
    }

    #[test]
    fn empty_and_non_finite_samples_are_errors() {
        assert_eq!(summarize(&[]), Err(StatsError::Empty));
        assert!(matches!(
            summarize(&[1.0, f64::NAN]),
            Err(StatsError::NotFinite { index: 1, .. })
        ));
        assert!(summarize(&[f64::INFINITY]).is_err());
        assert!(median(&[f64::NEG_INFINITY, 1.0]).is_err());
        let e = summarize(&[f64::NAN]).unwrap_err().to_string();
        assert!(e.contains("NaN"), "{e}");
    }
}
