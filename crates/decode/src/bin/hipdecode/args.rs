//! The flags `run` and `chat` share: how tokens are drawn, and where and how the model runs.

use anyhow::{Context, Result};
use decode::backend::Precision;
use decode::device::{BackendSettings, DeviceRequest};
use decode::sampler::SamplerConfig;

/// How tokens are drawn (`run` and `chat`).
#[derive(clap::Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    /// Sample from the k most likely tokens only (0: all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Sample from the smallest set of tokens whose probability reaches p.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SamplingArgs {
    pub fn config(&self) -> Result<SamplerConfig> {
        let sampler = SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed,
        };
        sampler.validate()?;
        Ok(sampler)
    }
}

/// Where and how the model runs (`run` and `chat`).
#[derive(clap::Args)]
pub struct BackendArgs {
    /// auto, cpu or gpu. auto picks the GPU when one is usable, else the CPU.
    #[arg(long, default_value = "auto")]
    pub device: DeviceRequest,
    /// KV cache size in positions (clamped to the model's context length).
    #[arg(long, default_value_t = 2048)]
    pub ctx: usize,
    /// CPU threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Multiply by f32 activations instead of 16-bit integer ones (slower; the reference path).
    #[arg(long)]
    pub exact: bool,
    /// GPU: run every decode step's kernels one by one instead of replaying a captured graph
    /// (the same tokens, slower; for debugging and comparison).
    #[arg(long)]
    pub no_graph: bool,
}

impl BackendArgs {
    /// The thread pool set up, and the backend's settings.
    pub fn settings(&self) -> Result<BackendSettings> {
        if let Some(t) = self.threads {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t.max(1))
                .build_global()
                .context("setting the thread count")?;
        }
        Ok(BackendSettings {
            cpu_precision: if self.exact {
                Precision::Exact
            } else {
                Precision::Fast
            },
            gpu_graphs: !self.no_graph,
            ..BackendSettings::default()
        })
    }
}
