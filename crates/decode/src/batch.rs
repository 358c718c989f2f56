//! One step's work: rows of tokens, each of one sequence at one position, and what each row
//! wants back.
//!
//! A [`StepBatch`] is what a [`crate::context::Context`] runs through the model in one step. A
//! row is a prompt token of a prefill chunk or the one new token of a decoding sequence; rows
//! of several sequences, at different positions, may share a step. The batch's [`Phase`] is
//! stated, not guessed from its length: a backend picks its decode kernels and captured
//! graphs from it, so a one-token prompt chunk is still a prefill.

use crate::sampler::SamplerConfig;

/// A sequence's index in its context (`0..ContextOptions::sequences`).
pub type SeqId = usize;

/// What a row is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowKind {
    /// A token of a prompt chunk.
    Prefill,
    /// The next token of a sequence that is generating: one per sequence and step.
    Decode,
}

/// What a row wants once the step has run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowOutput {
    /// Nothing: the row only extends its sequence's KV cache (most prompt tokens).
    Nothing,
    /// Its logits, kept in the context for [`crate::context::Context::read_logits`].
    Logits,
    /// A token drawn by its own sampler settings and seed (greedy at temperature 0). Its
    /// logits are kept as for [`RowOutput::Logits`].
    Sample(SamplerConfig),
}

impl RowOutput {
    pub fn wants_logits(&self) -> bool {
        !matches!(self, RowOutput::Nothing)
    }
}

/// How a backend runs a step: every row a decode token, or prompt chunks (any row a prefill
/// token makes the step a prefill).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Prefill,
    Decode,
}

/// One row of a step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchRow {
    pub seq: SeqId,
    /// Its position in its sequence.
    pub pos: usize,
    pub token: u32,
    pub kind: RowKind,
    pub output: RowOutput,
}

/// The rows of one step, kept column by column so a backend reads the tokens, positions and
/// sequences as slices (what a GPU backend copies into its step block).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepBatch {
    tokens: Vec<u32>,
    positions: Vec<usize>,
    sequences: Vec<SeqId>,
    kinds: Vec<RowKind>,
    outputs: Vec<RowOutput>,
    /// Trailing rows that only fill a captured graph's row bucket ([`StepBatch::padded_to`]).
    padding: usize,
}

impl StepBatch {
    pub fn new() -> StepBatch {
        StepBatch::default()
    }

    /// A prompt chunk of sequence `seq` from position `pos0`, with `last` wanted from its last
    /// row (or, with `every_row`, from each row).
    pub fn prefill(seq: SeqId, pos0: usize, tokens: &[u32], last: RowOutput) -> StepBatch {
        let mut batch = StepBatch::new();
        batch.push_prefill(seq, pos0, tokens, last);
        batch
    }

    /// One decode token of sequence `seq` at `pos`.
    pub fn decode(seq: SeqId, pos: usize, token: u32, output: RowOutput) -> StepBatch {
        let mut batch = StepBatch::new();
        batch.push(BatchRow {
            seq,
            pos,
            token,
            kind: RowKind::Decode,
            output,
        });
        batch
    }

    pub fn push(&mut self, row: BatchRow) {
        self.tokens.push(row.token);
        self.positions.push(row.pos);
        self.sequences.push(row.seq);
        self.kinds.push(row.kind);
        self.outputs.push(row.output);
    }

    /// Appends a prompt chunk of `seq` from `pos0`; only its last row wants `last`.
    pub fn push_prefill(&mut self, seq: SeqId, pos0: usize, tokens: &[u32], last: RowOutput) {
        for (i, &token) in tokens.iter().enumerate() {
            let output = if i + 1 == tokens.len() {
                last
            } else {
                RowOutput::Nothing
            };
            self.push(BatchRow {
                seq,
                pos: pos0 + i,
                token,
                kind: RowKind::Prefill,
                output,
            });
        }
    }

    /// Appends one decode row for each sequence `s < tokens.len()`: token `tokens[s]` at
    /// position `pos(s)` (its length so far), each wanting `output`. A step of every sequence
    /// at once, as a benchmark or a profile of B sequences runs it.
    pub fn push_decode_each(
        &mut self,
        tokens: &[u32],
        pos: impl Fn(SeqId) -> usize,
        output: RowOutput,
    ) {
        for (seq, &token) in tokens.iter().enumerate() {
            self.push(BatchRow {
                seq,
                pos: pos(seq),
                token,
                kind: RowKind::Decode,
                output,
            });
        }
    }

    /// Sets what row `row` wants back.
    pub fn set_output(&mut self, row: usize, output: RowOutput) {
        self.outputs[row] = output;
    }

    pub fn clear(&mut self) {
        self.tokens.clear();
        self.positions.clear();
        self.sequences.clear();
        self.kinds.clear();
        self.outputs.clear();
        self.padding = 0;
    }

    /// This decode batch with padding rows appended up to `rows`, so that a backend replays
    /// the graph it captured for that many rows (`Backend::bucket_rows`). A padding row is
    /// token 0 at position 0 of the first row's sequence and wants logits, so the padded step
    /// has the same ops as a step of `rows` real rows; a backend stores none of its keys and
    /// values, and nobody reads its logits. `None` unless this is a decode batch of real rows
    /// that all want logits, shorter than `rows` (the rows' logits then keep their places).
    pub fn padded_to(&self, rows: usize) -> Option<StepBatch> {
        let real = self.len();
        let fits = self.padding == 0
            && real < rows
            && self.phase() == Phase::Decode
            && self.n_outputs() == real;
        if !fits {
            return None;
        }
        let mut padded = self.clone();
        for _ in real..rows {
            padded.push(BatchRow {
                seq: self.sequences[0],
                pos: 0,
                token: 0,
                kind: RowKind::Decode,
                output: RowOutput::Logits,
            });
        }
        padded.padding = rows - real;
        Some(padded)
    }

    /// How many trailing rows are padding ([`StepBatch::padded_to`]): rows
    /// `len() - padding()..` store no keys or values.
    pub fn padding(&self) -> usize {
        self.padding
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn positions(&self) -> &[usize] {
        &self.positions
    }

    pub fn sequences(&self) -> &[SeqId] {
        &self.sequences
    }

    pub fn outputs(&self) -> &[RowOutput] {
        &self.outputs
    }

    pub fn row(&self, i: usize) -> BatchRow {
        BatchRow {
            seq: self.sequences[i],
            pos: self.positions[i],
            token: self.tokens[i],
            kind: self.kinds[i],
            output: self.outputs[i],
        }
    }

    pub fn rows(&self) -> impl Iterator<Item = BatchRow> + '_ {
        (0..self.len()).map(|i| self.row(i))
    }

    /// [`Phase::Decode`] when every row is a decode token, else [`Phase::Prefill`].
    pub fn phase(&self) -> Phase {
        if !self.kinds.is_empty() && self.kinds.iter().all(|&k| k == RowKind::Decode) {
            Phase::Decode
        } else {
            Phase::Prefill
        }
    }

    /// Rows that want logits (or a token), in order: logits row `i` of the step is the `i`-th.
    pub fn output_rows(&self) -> impl Iterator<Item = usize> + '_ {
        self.outputs
            .iter()
            .enumerate()
            .filter(|(_, o)| o.wants_logits())
            .map(|(i, _)| i)
    }

    /// How many rows want logits.
    pub fn n_outputs(&self) -> usize {
        self.outputs.iter().filter(|o| o.wants_logits()).count()
    }

    /// Whether the rows form one sequence's consecutive positions from the first row's (what a
    /// backend that runs one sequence per step needs).
    pub fn is_one_run(&self) -> bool {
        let (Some(&seq), Some(&pos0)) = (self.sequences.first(), self.positions.first()) else {
            return true;
        };
        self.sequences.iter().all(|&s| s == seq)
            && self
                .positions
                .iter()
                .enumerate()
                .all(|(i, &p)| p == pos0 + i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_is_decode_only_when_every_row_decodes() {
        let mut b = StepBatch::decode(0, 7, 3, RowOutput::Logits);
        assert_eq!(b.phase(), Phase::Decode);
        b.push_prefill(1, 0, &[5], RowOutput::Logits);
        assert_eq!(b.phase(), Phase::Prefill);
        // A one-token prompt is a prefill whatever its length.
        assert_eq!(
            StepBatch::prefill(0, 0, &[1], RowOutput::Logits).phase(),
            Phase::Prefill
        );
        assert_eq!(StepBatch::new().phase(), Phase::Prefill);
    }

    #[test]
    fn a_prefill_chunk_wants_output_from_its_last_row_only() {
        let b = StepBatch::prefill(2, 10, &[4, 5, 6], RowOutput::Logits);
        assert_eq!(b.positions(), &[10, 11, 12]);
        assert_eq!(b.sequences(), &[2, 2, 2]);
        assert_eq!(b.output_rows().collect::<Vec<_>>(), vec![2]);
        assert!(b.is_one_run());
        let mut two = b.clone();
        two.push(BatchRow {
            seq: 3,
            pos: 0,
            token: 1,
            kind: RowKind::Decode,
            output: RowOutput::Logits,
        });
        assert!(!two.is_one_run());
        assert_eq!(two.n_outputs(), 2);
    }
}
