//! (being filled)

use super::Case;

pub const CASES: &[Case] = &[];
