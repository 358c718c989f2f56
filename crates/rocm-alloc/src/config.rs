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
    /// Read the environment variables ([`crate::knobs`]; tests turn this off, or use
    /// [`crate::Allocator::with_env`]).
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
