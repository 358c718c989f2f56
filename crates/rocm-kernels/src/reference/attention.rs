//! attention reference: being written.
