//! sampling reference: being written.
