//! A stream-aware caching allocator for GPU memory whose every byte is bounded and explained.
