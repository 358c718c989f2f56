//! Benchmarks for hipdecode: `bench-decode` and the criterion suites.
//!
//! The measuring helpers live here so the binary stays a thin argument parser, one module per
//! idea:
//!
//! - [`cli`]: the command line (llama-bench's flags, and the old ones as aliases).
//! - [`measure`]: pp and tg tests on a loaded model, memory per phase.
//! - [`batched`]: `--npl`, llama-batched-bench's measurement (B sequences' prompts, then
//!   decode steps of B rows); [`batched_report`]: its md, json and csv output.
//! - [`stats`]: mean, sample standard deviation, median, MAD of the repetitions.
//! - [`model_info`]: the model, size and params columns.
//! - [`phase_memory`]: bytes per tag, allocator and process memory per phase; [`explain`]:
//!   every device byte of a phase in parts, graph memory, stranded bytes.
//! - [`report`]: the md, json and csv output; [`table`]: Markdown tables and CSV lines;
//!   [`llama_bench`]: llama-bench's JSON fields in every JSON test object, from the run's
//!   [`run_setup`].
//! - [`arms`], [`ab`], [`verdict`]: `--ab`, its child processes and its noise rule; [`sweep`]:
//!   `--sweep`, every memory knob against the defaults.
//! - [`timeline`], [`svg`]: `--svg`, the memory timeline.
//! - [`alloc_trace`]: `--alloc-trace`, the GPU allocator's trace for `cargo xtask replay`.
//! - [`offload_sweep`], [`curve`]: the offload sweep's table and tok/s-against-budget chart
//!   (`offload-sweep-report`).
//!
//! docs/bench-decode.md describes the tool.

pub mod ab;
pub mod alloc_trace;
pub mod arms;
pub mod batched;
pub mod batched_report;
pub mod cli;
pub mod curve;
pub mod explain;
pub mod llama_bench;
pub mod measure;
pub mod model_info;
pub mod offload_sweep;
pub mod phase_memory;
pub mod report;
pub mod run_setup;
pub mod stats;
pub mod svg;
pub mod sweep;
pub mod table;
pub mod timeline;
pub mod verdict;

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

/// Starts a new window for the process's peak RSS (`VmHWM`) by writing 5 to
/// `/proc/self/clear_refs` (Linux 4.0 on). Returns whether it worked; where it did not, the
/// peak RSS covers the whole process.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
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
    fn peak_rss_resets_to_about_the_current_rss() {
        // Touch 64 MiB so the peak is well above what stays resident afterwards.
        let big = vec![1u8; 64 << 20];
        assert_eq!(big.iter().map(|&b| b as usize).sum::<usize>(), 64 << 20);
        drop(big);
        let Some((_, before)) = process_memory() else {
            eprintln!("skipping: /proc/self/status is not available on this platform");
            return;
        };
        if !reset_peak_rss() {
            eprintln!("skipping: /proc/self/clear_refs is not writable here");
            return;
        }
        let (rss, after) = process_memory().unwrap();
        assert!(after < before, "peak {after} not below {before}");
        assert!(after >= rss);
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
