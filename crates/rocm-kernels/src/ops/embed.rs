//! embed: being written.
