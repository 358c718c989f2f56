//! attention: being written.
