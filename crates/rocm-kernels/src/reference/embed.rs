//! embed reference: being written.
