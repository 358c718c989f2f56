//! CPU reference of argmax and sampling: the decode crate's `argmax` and `Sampler::sample`,
//! with the uniform draw passed in instead of taken from the seeded generator.
//!
//! [`sample`] also reports how far the draw and the top-p cut were from a decision boundary
//! ([`Sampled::margin`]), so a test can tell a real disagreement from a float tie: where the
//! margin is below the rounding of the sums, another order of additions may pick the
//! neighbouring token.

use crate::error::Result;
use crate::ops::sampling::{check, SamplingParams};

/// Index of the largest value, the first on ties; NaN never wins, and neither does -inf (the
/// search starts from -inf and takes strictly larger values); 0 when nothing wins.
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in x.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best
}

/// A sampled token and its distance to a tie.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampled {
    /// The token id.
    pub token: u32,
    /// The smallest distance, as a fraction of the mass involved, between the draw's point
    /// (`u * total`) and the edges of the chosen token's interval, or (for `top_p < 1`) between
    /// `top_p` and the running probability on either side of the top-p cut; 0 when the top-k
    /// cut falls inside a run of equal logits (the CPU sampler keeps an unspecified part of
    /// such a run), and when the weights are NaN (a +inf logit, a -inf maximum, or `1 /
    /// temperature` overflowing). Infinite for greedy.
    pub margin: f64,
}

/// The token `Sampler::sample` picks from `logits` when its generator draws `u` in [0, 1):
/// greedy ([`argmax`]) at temperature 0, else candidates are the non-NaN logits (none: token 0),
/// the `top_k` largest kept (0: all), ordered by value descending then index ascending, weights
/// `exp((v - max) * (1 / temperature))` in f32 summed in f64, the shortest prefix whose
/// probability reaches `top_p` kept, and the first token whose running weight exceeds
/// `u * (kept weight)` chosen.
pub fn sample(logits: &[f32], params: &SamplingParams, u: f64) -> Result<Sampled> {
    check(logits.len(), params)?;
    if params.temperature == 0.0 {
        return Ok(Sampled {
            token: argmax(logits) as u32,
            margin: f64::INFINITY,
        });
    }
    let mut c: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.is_nan())
        .map(|(i, &v)| (i as u32, v))
        .collect();
    if c.is_empty() {
        return Ok(Sampled {
            token: 0,
            margin: f64::INFINITY,
        });
    }
    c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let k = if params.top_k == 0 {
        c.len()
    } else {
        params.top_k.min(c.len())
    };
    let mut margin = f64::INFINITY;
    if k < c.len() && c[k - 1].1.total_cmp(&c[k].1).is_eq() {
        margin = 0.0;
    }
    c.truncate(k);
    let max = c[0].1;
    let inv_t = 1.0 / params.temperature;
    let mut sum = 0.0f64;
    for (_, v) in c.iter_mut() {
        *v = ((*v - max) * inv_t).exp();
        sum += *v as f64;
    }
    if sum.is_nan() {
        // A +inf logit, a -inf maximum or an overflowing 1 / temperature: the CPU's weights
        // are NaN and its walk ends on the last candidate, which no rule of sampling asks for.
        margin = 0.0;
    }
    let top_p = params.top_p as f64;
    let mut keep = c.len();
    let mut acc = 0.0f64;
    for (i, (_, v)) in c.iter().enumerate() {
        let before = acc;
        acc += *v as f64 / sum;
        if acc >= top_p {
            keep = i + 1;
            // At top_p = 1 the cut can only drop a tail that rounding left out of the sum.
            if top_p < 1.0 {
                margin = margin.min(acc - top_p).min(top_p - before);
            }
            break;
        }
    }
    c.truncate(keep);
    let total: f64 = c.iter().map(|(_, v)| *v as f64).sum();
    let mut r = u * total;
    for &(id, v) in c.iter() {
        let before = r;
        r -= v as f64;
        if r < 0.0 {
            let m = before.min(-r) / total;
            return Ok(Sampled {
                token: id,
                margin: margin.min(m),
            });
        }
    }
    Ok(Sampled {
        token: c[c.len() - 1].0,
        margin: margin.min(r.abs() / total),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
        }
    }

    #[test]
    fn argmax_takes_the_first_largest_and_never_nan_or_minus_infinity() {
        assert_eq!(argmax(&[0.1, 3.0, -2.0, 3.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, f32::NAN]), 1);
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, -1e30]), 1);
        assert_eq!(argmax(&[-0.0, 0.0]), 0);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn sample_walks_the_hand_computed_distribution() {
        // Logits ln 3, ln 1, ln 2 at temperature 1: weights 1, 1/3, 2/3 (relative to the max),
        // ordered ids 0, 2, 1; probabilities 1/2, 1/3, 1/6.
        let logits = [3f32.ln(), 0.0, 2f32.ln()];
        let p = params(1.0, 0, 1.0);
        let pick = |u: f64| sample(&logits, &p, u).unwrap();
        assert_eq!(pick(0.0).token, 0);
        assert_eq!(pick(0.49).token, 0);
        assert_eq!(pick(0.51).token, 2);
        assert_eq!(pick(0.82).token, 2);
        assert_eq!(pick(0.84).token, 1);
        assert!((pick(0.49).margin - 0.01).abs() < 1e-6);
        // top_p 0.6 keeps ids 0 and 2 (1/2 < 0.6 <= 5/6): renormalised 3/5, 2/5.
        let p = params(1.0, 0, 0.6);
        assert_eq!(sample(&logits, &p, 0.59).unwrap().token, 0);
        assert_eq!(sample(&logits, &p, 0.61).unwrap().token, 2);
        assert_eq!(sample(&logits, &p, 0.99).unwrap().token, 2);
        // top_k 1 is greedy whatever the draw; temperature 0 is argmax.
        assert_eq!(
            sample(&logits, &params(5.0, 1, 1.0), 0.99).unwrap().token,
            0
        );
        assert_eq!(
            sample(&logits, &params(0.0, 0, 1.0), 0.99).unwrap().token,
            0
        );
    }

    #[test]
    fn nan_is_never_a_candidate_and_a_tie_at_the_top_k_cut_has_no_margin() {
        let logits = [f32::NAN, 1.0, f32::NAN];
        assert_eq!(sample(&logits, &params(1.0, 0, 1.0), 0.9).unwrap().token, 1);
        assert_eq!(
            sample(&[f32::NAN; 3], &params(1.0, 0, 1.0), 0.5)
                .unwrap()
                .token,
            0
        );
        let tied = sample(&[2.0, 1.0, 1.0], &params(1.0, 2, 1.0), 0.1).unwrap();
        assert_eq!(tied.token, 0);
        assert_eq!(tied.margin, 0.0);
        let nan_weights = sample(&[f32::NEG_INFINITY; 2], &params(1.0, 0, 1.0), 0.1).unwrap();
        assert_eq!((nan_weights.token, nan_weights.margin), (1, 0.0));
    }
}
