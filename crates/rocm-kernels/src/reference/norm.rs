//! norm reference: being written.
