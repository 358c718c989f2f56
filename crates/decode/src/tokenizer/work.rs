//! Counters of a tokenizer's work, shared by the pre-tokenizer and the BPE merge loop.

/// The work one encode did, counted so tests can check it grows linearly with the text
/// ([`super::Tokenizer::encode_counting`]); counting is a few additions, so every encode
/// does it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Steps of the pre-tokenizer's matchers ([`super::PreTokenizer::split_counting`] says
    /// what a step is).
    pub matcher_steps: u64,
    /// Adjacent symbol pairs the BPE merge loop looked up among the merges.
    pub merge_lookups: u64,
    /// Merges done.
    pub merges: u64,
    /// Searches of a look-around pattern that stopped at the matcher's backtracking limit
    /// (see [`super::PreTokenizer::split_counting`]).
    pub matcher_limits: u64,
}
