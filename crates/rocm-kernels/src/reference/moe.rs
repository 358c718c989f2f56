//! moe reference: being written.
