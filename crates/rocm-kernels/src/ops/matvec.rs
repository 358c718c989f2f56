//! matvec: being written.
