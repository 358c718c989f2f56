//! Choosing the next token from logits: greedy, or temperature with top-k and top-p, seeded.

use crate::error::{DecodeError, Result};

/// Sampling settings. `temperature == 0` means greedy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerConfig {
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches p; 1 keeps all.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
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
        Ok(())
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

    /// The sampling rule for a given `draw` (see [`Sampler::next_draw`]).
    pub fn sample_with_draw(&mut self, logits: &[f32], draw: f64) -> u32 {
        if self.config.is_greedy() {
            return rocm_kernels::reference::sampling::argmax(logits) as u32;
        }
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
            return 0;
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
        }
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
