//! The host's cores in GPU runs: the 8-bit matrix-vector products of the hybrid offload's host
//! half, and the pool of threads that runs them.

pub mod pool;
pub mod q8;
