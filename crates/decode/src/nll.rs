//! Scoring a model on a fixed text: the negative log-likelihood of each next token from a row
//! of logits, the running mean and its standard error, and which positions of a chunk of the
//! text are scored.
//!
//! The method is llama.cpp's perplexity: the text's tokens are cut into chunks, each chunk is
//! run from an empty KV cache, and only the logits of the second half of its positions are
//! scored, so every scored token is predicted from at least half a chunk of context (the first
//! positions, with little context, would otherwise dominate the mean). `hipdecode perplexity`
//! drives it; the figures compare KV cache types, quantizations and backends on one text.

use std::ops::Range;

/// Why a token or a text could not be scored.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum NllError {
    #[error(
        "logit {index} of the row is {value}: the model's output is not a finite number there, \
         so the token has no likelihood"
    )]
    NonFinite { index: usize, value: f32 },
    #[error("token {target} is outside the row of {vocab} logits")]
    TargetOutOfRange { target: u32, vocab: usize },
    #[error(
        "a chunk of {chunk} tokens scores no token (the second half of its positions, less the \
         last, which has no next token); give a chunk of at least {MIN_CHUNK} tokens"
    )]
    ChunkTooSmall { chunk: usize },
    #[error(
        "the text is {tokens} tokens, fewer than the {needed} that 2 chunks of {chunk} need; \
         give a longer text or a smaller chunk (at most {} tokens)",
        tokens / 2
    )]
    TextTooShort {
        tokens: usize,
        chunk: usize,
        needed: usize,
    },
    #[error("0 chunks evaluate nothing; give at least 1")]
    NoChunks,
}

/// The smallest chunk that scores a token: position 1 predicting position 2.
pub const MIN_CHUNK: usize = 3;

/// `-log softmax(logits)[target]` in f64: the log-sum-exp taken about the largest logit, so
/// logits in the thousands neither overflow nor lose the target's share. A logit that is NaN
/// or infinite is an error, not a likelihood: a mean with one NaN in it is NaN, and an
/// infinity would hide which position broke.
pub fn token_nll(logits: &[f32], target: u32) -> Result<f64, NllError> {
    let t = target as usize;
    let Some(&target_logit) = logits.get(t) else {
        return Err(NllError::TargetOutOfRange {
            target,
            vocab: logits.len(),
        });
    };
    let mut max = f64::NEG_INFINITY;
    for (index, &value) in logits.iter().enumerate() {
        if !value.is_finite() {
            return Err(NllError::NonFinite { index, value });
        }
        max = max.max(f64::from(value));
    }
    let sum: f64 = logits.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    // The largest term is exp(0) = 1, so the sum is at least 1 and its log finite.
    Ok(max + sum.ln() - f64::from(target_logit))
}

/// The running mean of scored NLLs and their spread (Welford's update, so a long text's
/// squares are not summed and subtracted).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NllStats {
    count: usize,
    mean: f64,
    /// Sum of squared differences from the running mean.
    m2: f64,
}

impl NllStats {
    pub fn new() -> NllStats {
        NllStats::default()
    }

    /// Adds one token's NLL.
    pub fn add(&mut self, nll: f64) {
        self.count += 1;
        let delta = nll - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (nll - self.mean);
    }

    /// Tokens scored.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The mean NLL in nats (0 before any token).
    pub fn mean(&self) -> f64 {
        self.mean
    }

    /// exp(mean NLL).
    pub fn perplexity(&self) -> f64 {
        self.mean.exp()
    }

    /// The standard error of the mean: the sample standard deviation over sqrt(count).
    /// `None` below 2 tokens, which have no spread. It treats the tokens as independent,
    /// which neighbouring tokens are not, so it is a lower bound on the real uncertainty.
    pub fn std_error(&self) -> Option<f64> {
        (self.count >= 2).then(|| (self.m2 / (self.count - 1) as f64 / self.count as f64).sqrt())
    }

    /// Half the width of the 95% interval of the mean (1.96 standard errors).
    pub fn ci95(&self) -> Option<f64> {
        self.std_error().map(|se| 1.96 * se)
    }
}

/// Which tokens of a text are run and scored: `chunks` chunks of `chunk` tokens from the
/// text's start (the rest of the text is left out), the logits at positions
/// `first_scored..chunk - 1` of each scored against the token after them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkPlan {
    pub chunk: usize,
    pub chunks: usize,
    pub first_scored: usize,
}

impl ChunkPlan {
    /// The plan for a text of `tokens` tokens cut into chunks of `chunk`, evaluating at most
    /// `max_chunks` of them. The text must hold 2 chunks, so that the standard error rests on
    /// more than one stretch of context.
    pub fn new(
        tokens: usize,
        chunk: usize,
        max_chunks: Option<usize>,
    ) -> Result<ChunkPlan, NllError> {
        if chunk < MIN_CHUNK {
            return Err(NllError::ChunkTooSmall { chunk });
        }
        let needed = chunk.saturating_mul(2);
        if tokens < needed {
            return Err(NllError::TextTooShort {
                tokens,
                chunk,
                needed,
            });
        }
        let whole = tokens / chunk;
        let chunks = match max_chunks {
            Some(0) => return Err(NllError::NoChunks),
            Some(n) => n.min(whole),
            None => whole,
        };
        Ok(ChunkPlan {
            chunk,
            chunks,
            first_scored: chunk / 2,
        })
    }

    /// The text's tokens of chunk `c`.
    pub fn tokens(&self, c: usize) -> Range<usize> {
        c * self.chunk..(c + 1) * self.chunk
    }

    /// Whether the logits at position `pos` of a chunk are scored (against the token at
    /// `pos + 1`).
    pub fn scores(&self, pos: usize) -> bool {
        (self.first_scored..self.chunk - 1).contains(&pos)
    }

    /// Tokens scored per chunk.
    pub fn scored_per_chunk(&self) -> usize {
        self.chunk - 1 - self.first_scored
    }

    /// Tokens scored in all.
    pub fn scored(&self) -> usize {
        self.chunks * self.scored_per_chunk()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand formula: -log(e^t / sum e^l), summed directly (fine for small logits).
    fn by_hand(logits: &[f64], target: usize) -> f64 {
        let sum: f64 = logits.iter().map(|l| l.exp()).sum();
        -(logits[target].exp() / sum).ln()
    }

    #[test]
    fn a_known_row_gives_the_hand_formula() {
        let row = [1.0f32, 2.0, 0.5, -3.0];
        let wide: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
        for target in 0..row.len() {
            let got = token_nll(&row, target as u32).unwrap();
            let want = by_hand(&wide, target);
            assert!((got - want).abs() < 1e-12, "{target}: {got} vs {want}");
        }
        // A uniform row is log(vocab) for every token.
        let flat = [0.25f32; 8];
        assert!((token_nll(&flat, 3).unwrap() - 8f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn large_logits_neither_overflow_nor_lose_precision() {
        // exp(1e4) overflows f64; shifted by the max, it is the row [0, -1, -2].
        let big = [10_000.0f32, 9_999.0, 9_998.0];
        let small = [0.0f32, -1.0, -2.0];
        for target in 0..3 {
            let got = token_nll(&big, target).unwrap();
            let want = token_nll(&small, target).unwrap();
            assert!(got.is_finite(), "{got}");
            assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        }
        // A token far below the rest has a large but finite NLL, not infinity.
        let far = token_nll(&[0.0, -5000.0], 1).unwrap();
        assert!((far - 5000.0).abs() < 1e-6, "{far}");
        // The certain token scores ~0, never below it.
        let sure = token_nll(&[100.0, -100.0], 0).unwrap();
        assert!((0.0..1e-80).contains(&sure), "{sure}");
    }

    #[test]
    fn non_finite_logits_and_bad_targets_are_errors() {
        assert!(matches!(
            token_nll(&[0.0, f32::NAN, 1.0], 0),
            Err(NllError::NonFinite { index: 1, .. })
        ));
        assert!(matches!(
            token_nll(&[f32::INFINITY, 0.0], 1),
            Err(NllError::NonFinite { index: 0, .. })
        ));
        assert!(matches!(
            token_nll(&[0.0, f32::NEG_INFINITY], 0),
            Err(NllError::NonFinite { index: 1, .. })
        ));
        assert_eq!(
            token_nll(&[0.0, 1.0], 2),
            Err(NllError::TargetOutOfRange {
                target: 2,
                vocab: 2
            })
        );
        assert!(token_nll(&[], 0).is_err());
        let text = token_nll(&[f32::NAN], 0).unwrap_err().to_string();
        assert!(
            text.contains("NaN") && text.contains("not a finite"),
            "{text}"
        );
    }

    #[test]
    fn the_mean_and_its_standard_error_match_the_textbook_formulas() {
        let xs = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        let mut s = NllStats::new();
        assert_eq!(s.std_error(), None);
        for x in xs {
            s.add(x);
        }
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        assert_eq!(s.count(), 8);
        assert!((s.mean() - 5.0).abs() < 1e-12);
        assert!((s.std_error().unwrap() - (var / n).sqrt()).abs() < 1e-12);
        assert!((s.ci95().unwrap() - 1.96 * (var / n).sqrt()).abs() < 1e-12);
        assert!((s.perplexity() - 5f64.exp()).abs() < 1e-9);
        // Far from zero, the running update keeps the spread (summed squares would not).
        let mut shifted = NllStats::new();
        for x in xs {
            shifted.add(x + 1e9);
        }
        assert!((shifted.std_error().unwrap() - s.std_error().unwrap()).abs() < 1e-6);
    }

    #[test]
    fn a_plan_scores_the_second_half_of_each_whole_chunk() {
        let p = ChunkPlan::new(1000, 100, None).unwrap();
        assert_eq!((p.chunks, p.first_scored), (10, 50));
        // Positions 50..=98 predict tokens 51..=99.
        assert_eq!(p.scored_per_chunk(), 49);
        assert_eq!(p.scored(), 490);
        assert!(!p.scores(49) && p.scores(50) && p.scores(98) && !p.scores(99));
        assert_eq!(p.tokens(2), 200..300);
        // An odd chunk: position 3 of 7 first, 3 scored.
        let odd = ChunkPlan::new(15, 7, None).unwrap();
        assert_eq!((odd.chunks, odd.first_scored, odd.scored()), (2, 3, 6));
        assert_eq!(ChunkPlan::new(1000, 100, Some(3)).unwrap().scored(), 147);
        assert_eq!(ChunkPlan::new(1000, 100, Some(30)).unwrap().chunks, 10);
        assert_eq!(
            ChunkPlan::new(3, 3, None),
            Err(NllError::TextTooShort {
                tokens: 3,
                chunk: 3,
                needed: 6
            })
        );
        assert_eq!(ChunkPlan::new(6, 3, None).unwrap().scored(), 2);
    }

    #[test]
    fn impossible_plans_say_what_is_needed() {
        assert_eq!(
            ChunkPlan::new(100, 2, None),
            Err(NllError::ChunkTooSmall { chunk: 2 })
        );
        let short = ChunkPlan::new(300, 256, None).unwrap_err().to_string();
        assert!(
            short.contains("300 tokens") && short.contains("512"),
            "{short}"
        );
        assert!(short.contains("at most 150"), "{short}");
        assert_eq!(ChunkPlan::new(100, 10, Some(0)), Err(NllError::NoChunks));
    }
}
