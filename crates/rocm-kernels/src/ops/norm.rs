//! norm: being written.
