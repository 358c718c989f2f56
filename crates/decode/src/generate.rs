//! The generation loop: prefill the prompt, then decode one token at a time, streaming each
//! token to a callback as it is chosen.

use crate::backend::Backend;
use crate::error::{DecodeError, Result};
use crate::sampler::SamplerConfig;
use crate::session::Session;
use std::time::{Duration, Instant};

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-sequence or end-of-turn token.
    EndOfSequence,
    /// The requested number of tokens was generated.
    TokenLimit,
    /// The KV cache is full.
    ContextFull,
}

/// What happened, with timings.
#[derive(Clone, Debug)]
pub struct GenerationReport {
    pub prompt_tokens: usize,
    /// Generated ids, including a final stop token.
    pub tokens: Vec<u32>,
    /// Prompt processing, up to and including the choice of the first new token.
    pub prefill: Duration,
    /// All later steps.
    pub decode: Duration,
    pub stop: StopReason,
}

impl GenerationReport {
    /// Prompt tokens per second.
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill.as_secs_f64().max(1e-9)
    }

    /// Decode steps per second (every generated token after the first is one step).
    pub fn decode_tok_s(&self) -> f64 {
        let steps = self.tokens.len().saturating_sub(1);
        steps as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

/// What [`generate`] drives: one sequence, a prompt then a token at a time. A [`Session`] on
/// one backend, or a [`crate::split_session::SplitSession`] over the ranks of a model split
/// for tensor parallelism.
pub trait Generator {
    /// Starts the sampling stream again from its seed.
    fn restart_sampler(&mut self);
    /// Runs a prompt without sampling.
    fn forward(&mut self, tokens: &[u32]) -> Result<()>;
    /// Runs a prompt and draws the next token.
    fn prefill_and_sample(&mut self, prompt: &[u32], sampler: &SamplerConfig) -> Result<u32>;
    /// Runs one token and draws the next.
    fn decode_and_sample(&mut self, token: u32, sampler: &SamplerConfig) -> Result<u32>;
    /// Tokens in the sequence so far.
    fn position(&self) -> usize;
    /// Positions the sequence may hold.
    fn context_len(&self) -> usize;
}

impl<B: Backend> Generator for Session<B> {
    fn restart_sampler(&mut self) {
        Session::restart_sampler(self)
    }
    fn forward(&mut self, tokens: &[u32]) -> Result<()> {
        Session::forward(self, tokens)
    }
    fn prefill_and_sample(&mut self, prompt: &[u32], sampler: &SamplerConfig) -> Result<u32> {
        Session::prefill_and_sample(self, prompt, sampler)
    }
    fn decode_and_sample(&mut self, token: u32, sampler: &SamplerConfig) -> Result<u32> {
        Session::decode_and_sample(self, token, sampler)
    }
    fn position(&self) -> usize {
        Session::position(self)
    }
    fn context_len(&self) -> usize {
        self.options().context
    }
}

/// Generates up to `max_new` tokens after `prompt`, calling `on_token` for each as it comes.
/// Stops early when `is_stop` says so (the stop token is reported and kept in the result).
/// Sampling starts from `sampler`'s seed at each call.
pub fn generate(
    session: &mut impl Generator,
    prompt: &[u32],
    max_new: usize,
    sampler: SamplerConfig,
    is_stop: &dyn Fn(u32) -> bool,
    on_token: &mut dyn FnMut(u32),
) -> Result<GenerationReport> {
    if prompt.is_empty() {
        return Err(DecodeError::InvalidArgument(
            "the prompt is empty; give at least one token (most models want BOS first)".into(),
        ));
    }
    sampler.validate()?;
    session.restart_sampler();
    let mut report = GenerationReport {
        prompt_tokens: prompt.len(),
        tokens: Vec::new(),
        prefill: Duration::ZERO,
        decode: Duration::ZERO,
        stop: StopReason::TokenLimit,
    };
    let t0 = Instant::now();
    if max_new == 0 {
        // Nothing to generate, but the prompt is still processed (and held to the context),
        // so what the report says of the prefill is what it took.
        session.forward(prompt)?;
        report.prefill = t0.elapsed();
        return Ok(report);
    }
    let mut next = session.prefill_and_sample(prompt, &sampler)?;
    report.prefill = t0.elapsed();
    let t1 = Instant::now();
    loop {
        report.tokens.push(next);
        on_token(next);
        if is_stop(next) {
            report.stop = StopReason::EndOfSequence;
            break;
        }
        if report.tokens.len() >= max_new {
            break;
        }
        if session.position() + 1 > session.context_len() {
            report.stop = StopReason::ContextFull;
            break;
        }
        next = session.decode_and_sample(next, &sampler)?;
    }
    report.decode = t1.elapsed();
    Ok(report)
}
