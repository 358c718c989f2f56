//! One sequence on one backend: a [`Model`], a [`Context`] of one sequence and the backend
//! they live on, driven a prompt or a token at a time. The CLI, the benchmarks and most tests
//! run through it; each call becomes a [`StepBatch`] of sequence 0.

use crate::backend::Backend;
use crate::batch::{RowKind, RowOutput, StepBatch};
use crate::context::{Context, ContextOptions};
use crate::error::{DecodeError, Result};
use crate::memory::MemoryReport;
use crate::model::{Model, ModelSpec, Shard};
use crate::sampler::SamplerConfig;
use gguf_loader::GgufFile;
use std::sync::Arc;

/// The sequence a session drives.
const SEQ: usize = 0;

/// A model, its one-sequence context and their backend.
pub struct Session<B: Backend> {
    // Fields drop in this order: the context's buffers and the weights before the backend
    // that holds their allocator.
    context: Context<B>,
    model: Model<B>,
    backend: B,
    /// The rows of the step being built, kept between steps.
    batch: StepBatch,
    /// The last step's last row, whose logits the `last_*` calls read.
    last_row: usize,
}

impl<B: Backend> Session<B> {
    /// Loads `file`'s weights into `backend` and makes a context of one sequence for
    /// `options` (whose `sequences` must be 1).
    pub fn load(file: &Arc<GgufFile>, backend: B, options: ContextOptions) -> Result<Self> {
        Session::load_with_progress(file, backend, options, &mut |_, _| {})
    }

    /// [`Session::load`], calling `progress(layers loaded, layers)` as the weights load (see
    /// [`Model::load_with_progress`]).
    pub fn load_with_progress(
        file: &Arc<GgufFile>,
        backend: B,
        options: ContextOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        Session::load_shard(file, backend, options, Shard::whole(), progress)
    }

    /// [`Session::load_with_progress`] of `shard`'s part of the model (tensor parallelism,
    /// [`Model::load_shard`]): the backend must hold the rank's collective, and every rank's
    /// session must be driven through the same calls ([`crate::split_session`] does that).
    pub fn load_shard(
        file: &Arc<GgufFile>,
        mut backend: B,
        options: ContextOptions,
        shard: Shard,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        if options.sequences != 1 {
            return Err(DecodeError::InvalidArgument(format!(
                "a session drives one sequence, not {}; make a Context for several",
                options.sequences
            )));
        }
        let started = std::time::Instant::now();
        let model = Model::load_shard(file, &mut backend, shard, progress)?;
        let context = Context::new(&model, &mut backend, options)?;
        tracing::info!(
            "loaded {} onto {} in {:.2?}",
            model.spec().arch_name,
            backend.describe(),
            started.elapsed()
        );
        Ok(Session {
            context,
            model,
            backend,
            batch: StepBatch::new(),
            last_row: 0,
        })
    }

    pub fn model(&self) -> &Model<B> {
        &self.model
    }

    pub fn context(&self) -> &Context<B> {
        &self.context
    }

    pub fn spec(&self) -> &ModelSpec {
        self.model.spec()
    }

    /// The context's bounds (the context clamped to the model's).
    pub fn options(&self) -> &ContextOptions {
        self.context.options()
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, for switches that do not change the model's buffers (profiling, peak
    /// counters).
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Positions already in the KV cache.
    pub fn position(&self) -> usize {
        self.context.len(SEQ)
    }

    /// Empties the KV cache so the next tokens start a new sequence at position 0.
    pub fn reset(&mut self) {
        self.context.clear(SEQ);
    }

    /// Keeps the KV cache's first `len` positions and drops the rest: the next token goes to
    /// position `len` (a conversation that shares a prefix with what the cache holds).
    pub fn rewind(&mut self, len: usize) -> Result<()> {
        if len > self.position() {
            return Err(crate::error::DecodeError::InvalidArgument(format!(
                "rewinding to position {len}, past the {} the cache holds",
                self.position()
            )));
        }
        self.context.truncate(SEQ, len)
    }

    /// Bytes in use, per tag.
    pub fn memory(&self) -> MemoryReport {
        self.backend.memory()
    }

    /// Total bytes of weight tensors in the file.
    pub fn file_weight_bytes(&self) -> u64 {
        self.model.file_weight_bytes()
    }

    /// Runs `tokens` as prompt chunks of at most the context's batch. Afterwards the logits of
    /// the last token (or of every token of the last chunk with `all_logits`) are kept.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<()> {
        self.run(tokens, RowKind::Prefill, RowOutput::Logits)
            .map(drop)
    }

    /// Runs one decode step of `token`; its logits are kept.
    pub fn decode(&mut self, token: u32) -> Result<()> {
        self.run(&[token], RowKind::Decode, RowOutput::Logits)
            .map(drop)
    }

    /// [`Session::forward`] of a prompt, then a token drawn from its last logits by
    /// `sampler` (this sequence's stream of draws, see [`Session::restart_sampler`]).
    pub fn prefill_and_sample(&mut self, prompt: &[u32], sampler: &SamplerConfig) -> Result<u32> {
        self.run(prompt, RowKind::Prefill, RowOutput::Sample(*sampler))
    }

    /// [`Session::decode`] of `token`, then the next token drawn by `sampler`.
    pub fn decode_and_sample(&mut self, token: u32, sampler: &SamplerConfig) -> Result<u32> {
        self.run(&[token], RowKind::Decode, RowOutput::Sample(*sampler))
    }

    /// Starts the sequence's sampling stream again from its seed.
    pub fn restart_sampler(&mut self) {
        self.context.restart_sampler(SEQ);
    }

    /// Runs `tokens` in steps of at most the batch bound. The last token's row wants `last`;
    /// with `all_logits` every row of the last chunk keeps its logits too. Returns the
    /// sampled token where `last` asks for one (else 0).
    fn run(&mut self, tokens: &[u32], kind: RowKind, last: RowOutput) -> Result<u32> {
        if tokens.is_empty() {
            return Err(DecodeError::InvalidArgument(
                "no tokens to run: give at least one".into(),
            ));
        }
        let needed = self.position() + tokens.len();
        if needed > self.context.capacity() {
            return Err(DecodeError::ContextFull {
                needed,
                capacity: self.context.capacity(),
            });
        }
        let max = self.context.options().max_batch;
        let all_logits = self.context.options().all_logits;
        let chunks = tokens.len().div_ceil(max);
        let mut token = 0;
        for (i, chunk) in tokens.chunks(max).enumerate() {
            let final_chunk = i + 1 == chunks;
            self.batch.clear();
            let pos0 = self.position();
            for (j, &t) in chunk.iter().enumerate() {
                let final_row = final_chunk && j + 1 == chunk.len();
                let output = if final_row {
                    last
                } else if all_logits {
                    RowOutput::Logits
                } else {
                    RowOutput::Nothing
                };
                self.batch.push(crate::batch::BatchRow {
                    seq: SEQ,
                    pos: pos0 + j,
                    token: t,
                    kind,
                    output,
                });
            }
            let sampled = self
                .model
                .step(&mut self.backend, &mut self.context, &self.batch)?;
            self.last_row = chunk.len() - 1;
            if let Some(s) = sampled.last() {
                token = s.token;
            }
        }
        Ok(token)
    }

    /// Logits of the last token processed, copied to the host.
    pub fn last_logits(&mut self, out: &mut Vec<f32>) -> Result<()> {
        self.context
            .read_logits(&mut self.backend, self.last_row, out)
    }

    /// Index of the largest logit of the last token, computed on the backend.
    pub fn last_argmax(&mut self) -> Result<u32> {
        let index = self.context.output_index(self.last_row)?;
        self.backend
            .argmax(&self.context.act.logits, index, self.spec().vocab)
    }

    /// A token sampled from the last token's logits on the backend (see [`Backend::sample`])
    /// with the given draw, or `None` where the backend does not sample.
    pub fn last_sample(&mut self, config: &SamplerConfig, draw: f64) -> Result<Option<u32>> {
        let index = self.context.output_index(self.last_row)?;
        let vocab = self.spec().vocab;
        self.backend
            .sample(&self.context.act.logits, index, vocab, config, draw)
    }

    /// Logits at every position of `tokens` from the current position on (needs
    /// `all_logits`), as `[tokens.len()][vocab]`.
    pub fn forward_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if !self.context.options().all_logits {
            return Err(DecodeError::InvalidArgument(
                "forward_all_logits needs a context made with all_logits".into(),
            ));
        }
        let v = self.spec().vocab;
        let mut out = vec![0.0; tokens.len() * v];
        let mut done = 0;
        for chunk in tokens.chunks(self.context.options().max_batch) {
            self.forward(chunk)?;
            self.backend.read(
                &self.context.act.logits,
                0,
                &mut out[done * v..(done + chunk.len()) * v],
            )?;
            done += chunk.len();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{cpu::CpuBackend, Precision};

    #[test]
    fn the_load_reports_each_layer_once_in_order() {
        let path =
            std::env::temp_dir().join(format!("session-progress-{}.gguf", std::process::id()));
        gguf_loader::synth::write_preset(gguf_loader::synth::Preset::TinyLlama, &path, 1).unwrap();
        let file = crate::open_model(&path).unwrap();
        let mut seen = Vec::new();
        let options = ContextOptions {
            context: 16,
            ..ContextOptions::default()
        };
        let session = Session::load_with_progress(
            &file,
            CpuBackend::new(Precision::Exact),
            options,
            &mut |done, layers| seen.push((done, layers)),
        )
        .unwrap();
        let layers = session.spec().n_layers;
        assert!(layers > 1);
        let expected: Vec<(usize, usize)> = (1..=layers).map(|d| (d, layers)).collect();
        assert_eq!(seen, expected);
        std::fs::remove_file(&path).ok();
    }
}
