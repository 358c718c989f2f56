//! elementwise: being written.
