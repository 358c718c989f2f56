//! matmul reference: being written.
