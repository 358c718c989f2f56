//! sampling: being written.
