//! Construction-time options of the allocator.

use crate::limits::LimitSpec;

/// Options for [`crate::Allocator::new`]. `Default` gives the bounded defaults described in
/// `docs/memory.md`.
#[derive(Clone, Debug)]
pub struct AllocatorConfig {
    /// Memory limit; `None` = the `HIPDECODE_MEMORY_LIMIT` variable if set, else the device
    /// default.
    pub memory_limit: Option<LimitSpec>,
    /// Cache limit; `None` = the `HIPDECODE_CACHE_LIMIT` variable if set, else
    /// [`crate::limits::DEFAULT_CACHE_LIMIT`] (4 MiB).
    pub cache_limit: Option<LimitSpec>,
    /// Read the environment variables (tests turn this off, or use
    /// [`crate::Allocator::with_env_lookup`]).
    pub read_env: bool,
    /// Weight bytes known up front (also settable later with `set_weight_bytes`); recorded in
    /// traces and reports, no limit depends on them.
    pub weight_bytes: u64,
    /// Start with a trace of this many events (`None` = tracing off).
    pub trace_capacity: Option<usize>,
    /// Automatic trims (done on a cache miss, before growing) spare idle segments used within
    /// this many allocations, so a steady loop whose working set exceeds the cache limit does
    /// not release and re-allocate the same segments every step. Explicit trims ignore it.
    pub trim_hot_window: u64,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            memory_limit: None,
            cache_limit: None,
            read_env: true,
            weight_bytes: 0,
            trace_capacity: None,
            trim_hot_window: DEFAULT_TRIM_HOT_WINDOW,
        }
    }
}

/// Default of [`AllocatorConfig::trim_hot_window`]: a few decode steps of a large model
/// (a step makes a few hundred allocations).
pub const DEFAULT_TRIM_HOT_WINDOW: u64 = 4096;

/// Environment variable overriding [`AllocatorConfig::trim_hot_window`]: how many allocations
/// an idle segment stays spared from automatic trims, which is how long freed memory waits
/// before it can go back to the device. It applies while the config field holds its default.
pub const TRIM_WINDOW_ENV: &str = "HIPDECODE_TRIM_WINDOW";

/// A `HIPDECODE_TRIM_WINDOW` value that is not a whole number of allocations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{TRIM_WINDOW_ENV}={value:?} is not a valid trim window ({reason}); give a whole number of \
     allocations, e.g. \"4096\" (the default) or \"0\" to spare nothing"
)]
pub struct TrimWindowParseError {
    /// The rejected text.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Parses a trim window: a non-negative integer count of allocations.
pub fn parse_trim_window(text: &str) -> Result<u64, TrimWindowParseError> {
    let t = text.trim();
    let err = |reason: &str| TrimWindowParseError {
        value: text.to_string(),
        reason: reason.to_string(),
    };
    if t.is_empty() {
        return Err(err("empty"));
    }
    if !t.chars().all(|c| c.is_ascii_digit()) {
        return Err(err("not a non-negative integer"));
    }
    t.parse().map_err(|_| err("too large"))
}

/// Reads [`TRIM_WINDOW_ENV`] through `lookup` (normally `std::env::var`). Absent → `Ok(None)`.
pub fn trim_window_from_env(
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<u64>, TrimWindowParseError> {
    lookup(TRIM_WINDOW_ENV)
        .map(|v| parse_trim_window(&v))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trim_window_parses_counts_and_names_the_variable_on_error() {
        assert_eq!(parse_trim_window("0"), Ok(0));
        assert_eq!(parse_trim_window(" 65536 "), Ok(65536));
        for bad in ["", "-1", "1.5", "4k", "lots"] {
            let e = parse_trim_window(bad).unwrap_err().to_string();
            assert!(
                e.contains(TRIM_WINDOW_ENV) && e.contains("whole number"),
                "{e}"
            );
        }
        assert_eq!(trim_window_from_env(&|_| None), Ok(None));
        assert_eq!(trim_window_from_env(&|_| Some("12".into())), Ok(Some(12)));
    }
}
