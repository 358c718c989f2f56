//! moe: being written.
