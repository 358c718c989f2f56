//! kv_cache: being written.
