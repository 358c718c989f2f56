//! matvec reference: being written.
