//! kv_cache reference: being written.
