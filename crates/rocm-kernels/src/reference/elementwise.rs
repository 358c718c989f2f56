//! elementwise reference: being written.
