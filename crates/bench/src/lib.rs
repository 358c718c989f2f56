//! Benchmarks for hipdecode: `bench-decode` and the criterion suites.
//!
//! The measuring helpers live here so the binary stays a thin argument parser.

use std::time::Duration;

/// The median of a set of durations (the mean of the middle two for an even count).
pub fn median(samples: &[Duration]) -> Duration {
    assert!(!samples.is_empty(), "median of no samples");
    let mut s = samples.to_vec();
    s.sort();
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2
    }
}

/// Resident and peak resident memory of this process in bytes, from `/proc/self/status`
/// (`None` where that file does not exist).
pub fn process_memory() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        let ms = Duration::from_millis;
        assert_eq!(median(&[ms(5), ms(1), ms(3)]), ms(3));
        assert_eq!(
            median(&[ms(4), ms(1), ms(3), ms(2)]),
            Duration::from_micros(2500)
        );
    }

    #[test]
    fn process_memory_is_nonzero_on_linux() {
        if let Some((rss, peak)) = process_memory() {
            assert!(rss > 0 && peak >= rss);
        } else {
            eprintln!("skipping: /proc/self/status is not available on this platform");
        }
    }
}
