//! matmul: being written.
