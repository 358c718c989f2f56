//! The flags `run` and `chat` share: how tokens are drawn, and where and how the model runs.

use anyhow::{Context, Result};
use decode::backend::Precision;
use decode::device::{BackendSettings, DeviceRequest};
use decode::kv::KvType;
use decode::sampler::SamplerConfig;

/// How tokens are drawn (`run` and `chat`).
#[derive(clap::Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8, allow_hyphen_values = true)]
    pub temperature: f32,
    /// Sample from the k most likely tokens only (0: all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Sample from the smallest set of tokens whose probability reaches p.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Sample from the tokens at least this likely relative to the most likely one (0: all).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Divide a recent token's positive logit (multiply its negative one) by this (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Subtract this from the logit of every recent token (0: off; -2 to 2).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    pub presence_penalty: f32,
    /// Subtract this per time a recent token appeared (0: off; -2 to 2).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    pub frequency_penalty: f32,
    /// Tokens the penalties look back over, the prompt's included.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed for sampling (default: a random one, printed so the run can be repeated).
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The settings, checked; without `--seed`, with a random seed ([`SamplingArgs::seed_note`]
    /// says which).
    pub fn config(&self) -> Result<SamplerConfig> {
        let seed = self.seed.unwrap_or_else(random_seed);
        let sampler = SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repeat_last_n: self.repeat_last_n,
            seed,
        };
        sampler.validate()?;
        Ok(sampler)
    }

    /// The line that tells a sampled run's random seed, printed once the model is loaded.
    pub fn seed_note(&self, config: &SamplerConfig) -> Option<String> {
        let seed = config.seed;
        (self.seed.is_none() && !config.is_greedy())
            .then(|| format!("sampling seed {seed} (--seed {seed} repeats this run)"))
    }
}

/// A seed from the standard library's per-process random hasher keys.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Where and how the model runs (`run` and `chat`).
#[derive(clap::Args)]
pub struct BackendArgs {
    /// auto, cpu or gpu. auto picks the GPU when one is usable, else the CPU.
    #[arg(long, default_value = "auto")]
    pub device: DeviceRequest,
    /// KV cache size in positions (clamped to the model's context length).
    #[arg(short = 'c', long, visible_alias = "ctx-size", default_value_t = 2048)]
    pub ctx: usize,
    /// CPU threads (default: one per core).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Multiply by f32 activations instead of 16-bit integer ones (slower; the reference path).
    #[arg(long)]
    pub exact: bool,
    /// GPU: run every decode step's kernels one by one instead of replaying a captured graph
    /// (the same tokens, slower; for debugging and comparison).
    #[arg(long)]
    pub no_graph: bool,
    /// The KV cache's key type: f32, f16 or q8_0 (also `-ctk`, as llama.cpp spells it).
    /// Default: f16 on the GPU, f32 on the CPU (which holds every type's values in f32 rows,
    /// rounded as the GPU stores them).
    #[arg(long = "cache-type-k", value_name = "TYPE")]
    pub cache_type_k: Option<KvType>,
    /// The KV cache's value type (also `-ctv`). K and V are stored as one type: giving one of
    /// the two sets both.
    #[arg(long = "cache-type-v", value_name = "TYPE")]
    pub cache_type_v: Option<KvType>,
}

impl BackendArgs {
    /// The KV cache type `-ctk` / `-ctv` ask for, `None` for the backend's default.
    pub fn kv_type(&self) -> Result<Option<KvType>> {
        KvType::of_flags(self.cache_type_k, self.cache_type_v).map_err(anyhow::Error::msg)
    }

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
            kv_type: self.kv_type()?,
            ..BackendSettings::default()
        })
    }
}

/// `base` with a GPU budget's plan carried out (printed first): what `--gpu-budget` and
/// `--host-budget` ask of a run on `choice`, with the knobs read once so the plan prices
/// what the backend then opens with.
pub fn with_budget(
    base: BackendSettings,
    choice: &decode::device::BackendChoice,
    file: &decode::gguf_loader::GgufFile,
    bounds: &decode::context::ContextOptions,
    gpu_budget: Option<&str>,
    host_budget: Option<&str>,
) -> Result<BackendSettings> {
    let mut gpu_config = decode::backend::gpu::GpuConfig::from_process()?;
    if let Some(kv) = base.kv_type {
        gpu_config.kv_type = kv;
    }
    let budget_run = decode::budget_run::for_choice(
        choice,
        file,
        gpu_budget,
        host_budget,
        decode::layout::LayoutOptions::gpu(bounds, &gpu_config, base.gpu_max_batch),
        gpu_config.cpu_share,
    )?;
    if let Some(b) = &budget_run {
        eprint!("{}", b.summary());
    }
    Ok(BackendSettings {
        gpu_offload: budget_run.map(|b| b.offload),
        gpu_config: Some(gpu_config),
        ..base
    })
}

/// llama.cpp's layer-placement flags, which have no meaning here, and what to use instead:
/// `-ngl 99` would otherwise read as `-n gl`. `None` when `args` holds none of them.
pub fn llama_cpp_layer_flag(args: impl Iterator<Item = String>) -> Option<String> {
    const FLAGS: [&str; 4] = ["-ngl", "--n-gpu-layers", "-ncmoe", "--n-cpu-moe"];
    let found = args.take_while(|a| a != "--").find(|a| {
        FLAGS
            .iter()
            .any(|f| a == f || a.starts_with(&format!("{f}=")))
    })?;
    let flag = found.split('=').next().unwrap_or(&found).to_string();
    Some(format!(
        "{flag} is llama.cpp's: hipdecode places weights by bytes, not layers. Give \
         --gpu-budget SIZE (\"6GiB\", \"75%\") and the planner keeps what fits on the GPU and \
         reads the rest from host memory (`hipdecode plan -m MODEL --gpu-budget SIZE` shows \
         where each weight goes); without it everything is on the GPU"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_layer_flags_are_named_with_the_budget_to_use_instead() {
        let of = |a: &[&str]| llama_cpp_layer_flag(a.iter().map(|s| s.to_string()));
        for a in [&["run", "-ngl", "99"][..], &["serve", "--n-cpu-moe=12"]] {
            let m = of(a).expect("refused");
            assert!(m.contains("--gpu-budget") && m.contains("llama.cpp"), "{m}");
        }
        assert!(of(&["run", "-ngl=99"]).unwrap().starts_with("-ngl is"));
        assert_eq!(of(&["run", "-n", "99", "-p", "x"]), None);
        // After `--` it is an argument, not a flag.
        assert_eq!(of(&["run", "--", "-ngl"]), None);
    }
}
