//! Choosing the next token from logits: greedy, or temperature with top-k, top-p and min-p,
//! seeded, after penalties for the tokens the sequence has seen.
//!
//! The chain, in order (each step on what the step before kept):
//! 1. penalties over the last `repeat_last_n` tokens of the sequence (prompt included), per
//!    token t seen c times: llama.cpp's repeat penalty (a positive logit divided by
//!    `repeat_penalty`, a negative one multiplied), then OpenAI's `logit -= c *
//!    frequency_penalty + presence_penalty` (c > 0);
//! 2. greedy (temperature 0) takes the largest logit here;
//! 3. top-k: the k largest logits;
//! 4. temperature: `softmax(logit / temperature)`;
//! 5. top-p: the smallest most-likely-first prefix whose probability reaches p;
//! 6. min-p (llama.cpp's): the tokens whose probability at temperature 1 is at least `min_p`
//!    times the most likely one's, that is `logit >= max + ln(min_p)`;
//! 7. one seeded uniform draw over what is left.

use crate::error::{DecodeError, Result};

/// Most tokens the penalties look back over.
pub const MAX_REPEAT_LAST_N: usize = 4096;

/// Temperatures below this are greedy: the softmax at such a temperature puts all but nothing
/// on the most likely token already, and below about 3e-39 `1 / temperature` is infinite,
/// which would turn every scaled logit into NaN.
pub const GREEDY_BELOW: f32 = 1e-6;

/// Sampling settings. A temperature of 0 (or below [`GREEDY_BELOW`]) means greedy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerConfig {
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches p; 1 keeps all.
    pub top_p: f32,
    /// Keep the tokens at least this likely relative to the most likely one; 0 keeps all.
    pub min_p: f32,
    /// Divides a seen token's positive logit and multiplies its negative one; 1 is off.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every seen token; 0 is off.
    pub presence_penalty: f32,
    /// Subtracted from a seen token's logit per time it was seen; 0 is off.
    pub frequency_penalty: f32,
    /// Tokens the penalties look back over (at most [`MAX_REPEAT_LAST_N`]).
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig::GREEDY
    }
}

impl SamplerConfig {
    /// Greedy, no penalties; the other steps at their usual values for when a temperature is
    /// set. The default, usable in constants.
    pub const GREEDY: SamplerConfig = SamplerConfig {
        temperature: 0.0,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.0,
        repeat_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        repeat_last_n: 64,
        seed: 0,
    };

    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_BELOW
    }

    /// Whether any penalty changes the logits.
    pub fn has_penalties(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }

    /// Whether the chain needs what only the host has: the sequence's tokens (penalties) or a
    /// step the device sampler lacks (min-p). A backend that samples on the device leaves
    /// these to the host.
    pub fn needs_host(&self) -> bool {
        self.has_penalties() || self.min_p > 0.0
    }

    /// Rejects settings that have no meaning, naming the bad one.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(DecodeError::InvalidArgument(format!(
                "--temp must be a finite number >= 0, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(DecodeError::InvalidArgument(format!(
                "--top-p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(DecodeError::InvalidArgument(format!(
                "--min-p must be in [0, 1], got {}",
                self.min_p
            )));
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return Err(DecodeError::InvalidArgument(format!(
                "--repeat-penalty must be a finite number > 0, got {}",
                self.repeat_penalty
            )));
        }
        for (name, v) in [
            ("--presence-penalty", self.presence_penalty),
            ("--frequency-penalty", self.frequency_penalty),
        ] {
            if !(v.is_finite() && (-2.0..=2.0).contains(&v)) {
                return Err(DecodeError::InvalidArgument(format!(
                    "{name} must be in [-2, 2] (OpenAI's range), got {v}"
                )));
            }
        }
        if self.repeat_last_n > MAX_REPEAT_LAST_N {
            return Err(DecodeError::InvalidArgument(format!(
                "--repeat-last-n must be at most {MAX_REPEAT_LAST_N}, got {}",
                self.repeat_last_n
            )));
        }
        Ok(())
    }
}

/// Step 1 of the chain: `logits` with the penalties of `config` for the tokens in `recent`
/// (the sequence's tokens, oldest first; the last `repeat_last_n` count).
pub fn apply_penalties(logits: &mut [f32], recent: &[u32], config: &SamplerConfig) {
    if !config.has_penalties() {
        return;
    }
    let window = &recent[recent.len().saturating_sub(config.repeat_last_n)..];
    let mut counts: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    for &t in window {
        *counts.entry(t).or_default() += 1;
    }
    for (&t, &c) in &counts {
        let Some(l) = logits.get_mut(t as usize) else {
            continue;
        };
        if *l > 0.0 {
            *l /= config.repeat_penalty;
        } else {
            *l *= config.repeat_penalty;
        }
        *l -= c as f32 * config.frequency_penalty + config.presence_penalty;
    }
}

/// A seeded sampler. The same seed, settings and logits give the same tokens.
pub struct Sampler {
    config: SamplerConfig,
    rng: SplitMix64,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Result<Sampler> {
        config.validate()?;
        Ok(Sampler {
            config,
            rng: SplitMix64(config.seed),
            candidates: Vec::new(),
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Picks a token from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.config.is_greedy() {
            return rocm_kernels::reference::sampling::argmax(logits) as u32;
        }
        let draw = self.next_draw();
        self.sample_with_draw(logits, draw)
    }

    /// The uniform draw in [0, 1) the next non-greedy [`Sampler::sample`] would use: a backend
    /// that samples on the device takes it from here, so the seed gives the same tokens on
    /// either side.
    pub fn next_draw(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// The sampling rule for a given `draw` (see [`Sampler::next_draw`]), with no penalties.
    pub fn sample_with_draw(&mut self, logits: &[f32], draw: f64) -> u32 {
        self.sample_after_penalties(logits, draw)
    }

    /// The whole chain for a given `draw`, the penalties over `recent` (the sequence's tokens,
    /// oldest first) included.
    pub fn sample_with_history(&mut self, logits: &mut [f32], recent: &[u32], draw: f64) -> u32 {
        apply_penalties(logits, recent, &self.config);
        self.sample_after_penalties(logits, draw)
    }

    /// The distribution the draw picks from, after the whole chain (penalties over `recent`
    /// included): the kept tokens, most likely first, with probabilities that sum to 1. Greedy
    /// gives the one largest logit.
    pub fn distribution(&mut self, logits: &mut [f32], recent: &[u32]) -> Vec<(u32, f64)> {
        apply_penalties(logits, recent, &self.config);
        if self.config.is_greedy() {
            let best = rocm_kernels::reference::sampling::argmax(logits) as u32;
            return vec![(best, 1.0)];
        }
        self.weigh(logits);
        let total: f64 = self.candidates.iter().map(|&(_, v)| v as f64).sum();
        (self.candidates.iter())
            .map(|&(id, v)| (id, v as f64 / total))
            .collect()
    }

    fn sample_after_penalties(&mut self, logits: &[f32], draw: f64) -> u32 {
        if self.config.is_greedy() {
            return rocm_kernels::reference::sampling::argmax(logits) as u32;
        }
        self.weigh(logits);
        let c = &self.candidates;
        if c.is_empty() {
            return 0;
        }
        let total: f64 = c.iter().map(|(_, v)| *v as f64).sum();
        let mut r = draw * total;
        for &(id, v) in c.iter() {
            r -= v as f64;
            if r < 0.0 {
                return id;
            }
        }
        c[c.len() - 1].0
    }

    /// Steps 3 to 6 of the chain: the kept candidates, most likely first, with weights
    /// proportional to their probabilities (none when every logit is NaN).
    fn weigh(&mut self, logits: &[f32]) {
        let c = &mut self.candidates;
        c.clear();
        c.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, v)| !v.is_nan())
                .map(|(i, &v)| (i as u32, v)),
        );
        if c.is_empty() {
            return;
        }
        let k = if self.config.top_k == 0 {
            c.len()
        } else {
            self.config.top_k.min(c.len())
        };
        if k < c.len() {
            c.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
            c.truncate(k);
        }
        c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let max = c[0].1;
        // Min-p on the logits, before the temperature changes them: p / p_max >= min_p.
        let min_logit = (self.config.min_p > 0.0).then(|| max + self.config.min_p.ln());
        let inv_t = 1.0 / self.config.temperature;
        let mut sum = 0.0f64;
        for (_, v) in c.iter_mut() {
            *v = ((*v - max) * inv_t).exp();
            sum += *v as f64;
        }
        // Top-p: the smallest prefix (most likely first) whose mass reaches p.
        let mut keep = c.len();
        let mut acc = 0.0f64;
        for (i, (_, v)) in c.iter().enumerate() {
            acc += *v as f64 / sum;
            if acc >= self.config.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        c.truncate(keep);
        if let Some(floor) = min_logit {
            // The candidates are sorted, most likely first; the most likely always stays. A
            // kept candidate's value is exp((logit - max) / t), so logit >= floor is value >=
            // exp((floor - max) / t).
            let value_floor = ((floor - max) * inv_t).exp();
            let kept = c
                .iter()
                .take_while(|(_, v)| *v >= value_floor)
                .count()
                .max(1);
            c.truncate(kept);
        }
    }
}

/// SplitMix64: small, fast and good enough for sampling; seeded explicitly for reproducibility.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> SamplerConfig {
        SamplerConfig {
            temperature,
            top_k,
            top_p,
            seed,
            ..SamplerConfig::default()
        }
    }

    /// A temperature so small that `1 / t` is infinite (and any below GREEDY_BELOW) takes the
    /// most likely token, never the least likely one that NaN weights used to pick.
    #[test]
    fn a_tiny_temperature_is_greedy() {
        let logits = [0.5, 3.0, -1.0, 2.9];
        for t in [1e-40f32, f32::MIN_POSITIVE, 1e-7] {
            let mut s = Sampler::new(cfg(t, 0, 1.0, 3)).unwrap();
            assert!(s.config().is_greedy(), "{t}");
            for _ in 0..8 {
                assert_eq!(s.sample(&logits), 1, "temperature {t}");
            }
            let mut l = logits;
            assert_eq!(s.distribution(&mut l, &[]), vec![(1, 1.0)], "{t}");
        }
        assert!(!cfg(GREEDY_BELOW, 0, 1.0, 3).is_greedy());
    }

    #[test]
    fn min_p_keeps_the_tokens_near_the_most_likely_one() {
        // Relative to the first: e^-0.5 = 0.61, e^-1 = 0.37, e^-3 = 0.05. min_p = 0.3 keeps
        // three, whatever the temperature.
        let logits = [3.0, 2.5, 2.0, 0.0];
        for t in [0.5, 1.0, 2.0] {
            let mut s = Sampler::new(SamplerConfig {
                min_p: 0.3,
                ..cfg(t, 0, 1.0, 9)
            })
            .unwrap();
            let mut seen = [0usize; 4];
            for _ in 0..3000 {
                seen[s.sample(&logits) as usize] += 1;
            }
            assert_eq!(seen[3], 0, "t {t}: {seen:?}");
            assert!(seen[2] > 0, "t {t}: {seen:?}");
        }
    }

    #[test]
    fn penalties_push_seen_tokens_down_and_greedy_follows() {
        let c = SamplerConfig {
            repeat_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..SamplerConfig::default()
        };
        let mut logits = [4.0, -1.0, 3.0, 0.5];
        // Token 0 seen twice, token 1 once; token 3 only outside the window of 64.
        let mut recent = vec![3u32];
        recent.extend(std::iter::repeat_n(2u32, 0));
        recent.extend(std::iter::repeat_n(7u32, 63));
        recent.extend([0, 1, 0]);
        apply_penalties(&mut logits, &recent, &c);
        assert_eq!(logits, [4.0 / 2.0 - 0.5 - 0.5, -2.0 - 0.25 - 0.5, 3.0, 0.5]);
        let mut s = Sampler::new(c).unwrap();
        let mut raw = [4.0, -1.0, 3.0, 0.5];
        assert_eq!(s.sample_with_history(&mut raw, &recent, 0.5), 2);
        assert!(SamplerConfig {
            frequency_penalty: 2.5,
            ..c
        }
        .validate()
        .is_err());
    }

    #[test]
    fn greedy_takes_the_largest_logit() {
        let mut s = Sampler::new(cfg(0.0, 40, 0.9, 1)).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, -2.0, 2.9]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_whatever_the_temperature() {
        let mut s = Sampler::new(cfg(5.0, 1, 1.0, 7)).unwrap();
        for _ in 0..50 {
            assert_eq!(s.sample(&[0.1, 3.0, -2.0, 2.9]), 1);
        }
    }

    #[test]
    fn top_p_drops_the_unlikely_tail() {
        // Probabilities ~ 0.64, 0.24, 0.09, 0.03: p = 0.8 keeps the first two only.
        let logits = [3.0, 2.0, 1.0, 0.0];
        let mut s = Sampler::new(cfg(1.0, 0, 0.8, 3)).unwrap();
        let mut seen = [0usize; 4];
        for _ in 0..2000 {
            seen[s.sample(&logits) as usize] += 1;
        }
        assert_eq!(seen[2] + seen[3], 0, "{seen:?}");
        // Renormalized over the two kept: 0.73 / 0.27.
        let frac = seen[0] as f64 / 2000.0;
        assert!((frac - 0.731).abs() < 0.04, "{seen:?}");
    }

    #[test]
    fn same_seed_same_tokens_and_temperature_follows_the_softmax() {
        let logits: Vec<f32> = (0..10).map(|i| i as f32 * 0.3).collect();
        let run = |seed| {
            let mut s = Sampler::new(cfg(0.7, 0, 1.0, seed)).unwrap();
            (0..200).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
        let draws = run(5);
        let top = draws.iter().filter(|&&t| t == 9).count() as f64 / 200.0;
        let z: f64 = (0..10).map(|i| (i as f64 * 0.3 / 0.7).exp()).sum();
        let p9 = (9.0 * 0.3 / 0.7f64).exp() / z;
        assert!((top - p9).abs() < 0.1, "{top} vs {p9}");
    }

    #[test]
    fn a_draw_taken_apart_gives_the_same_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let mut whole = Sampler::new(cfg(0.9, 20, 0.9, 5)).unwrap();
        let mut parts = Sampler::new(cfg(0.9, 20, 0.9, 5)).unwrap();
        for _ in 0..64 {
            let draw = parts.next_draw();
            assert_eq!(whole.sample(&logits), parts.sample_with_draw(&logits, draw));
        }
    }

    #[test]
    fn bad_settings_are_rejected_with_their_name() {
        let e = Sampler::new(cfg(-1.0, 0, 1.0, 0)).err().unwrap();
        assert!(e.to_string().contains("--temp"));
        let e = Sampler::new(cfg(1.0, 0, 0.0, 0)).err().unwrap();
        assert!(e.to_string().contains("--top-p"));
    }
}
