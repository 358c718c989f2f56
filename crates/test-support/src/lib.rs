//! What the workspace's tests share, so each helper is written once: a dev-dependency only.
//!
//! - [`gpu`]: one GPU test at a time per test process, and the device-or-skip entry point;
//! - [`models`]: the workspace and models folders, the real test model or a printed skip, and
//!   scratch folders;
//! - [`rng`]: the one deterministic generator tests draw their inputs from;
//! - [`tolerance`]: comparisons of float results that fail on NaN instead of passing it.

pub mod gpu;
pub mod models;
pub mod rng;
pub mod tolerance;
