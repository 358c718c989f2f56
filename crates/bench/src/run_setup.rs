//! How a bench-decode run was set up, in the terms llama-bench records: the device, the host
//! CPU, the model's type, threads, KV type, layers on the GPU and the step size. Read once per
//! model after it is loaded; [`crate::llama_bench`] writes it into every JSON test object.

use crate::model_info::{format_params, ModelInfo};
use decode::backend::Backend;
use decode::device::BackendChoice;
use decode::session::Session;
use decode::GgufFile;

/// How a run was set up, in the terms llama-bench records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSetup {
    /// `CPU`, or the GPU runtime's name (`CUDA` on NVIDIA, `HIP` on AMD), as llama-bench names
    /// its backends.
    pub backends: String,
    /// The GPU's name; empty on the CPU.
    pub gpu_info: String,
    /// The host CPU's model name.
    pub cpu_info: String,
    /// Architecture, parameter count and most common weight type (`llama 8.03 B Q4_K`).
    pub model_type: String,
    /// The host threads the CPU backend and the offload split use.
    pub n_threads: usize,
    /// The KV cache's element type (`f16`, `q8_0`, `f32`); keys and values share it.
    pub kv_type: String,
    /// Layers whose weights the GPU reads: all of them on the GPU backend, none on the CPU.
    pub n_gpu_layers: usize,
    /// The most prompt rows one step takes (llama-bench's `n_batch` and `n_ubatch`: hipdecode
    /// has one chunk size for both).
    pub n_batch: usize,
    /// Whether prefill attention is the fused (flash) kernel: yes on the GPU.
    pub flash_attn: bool,
}

/// Where a run computes, named as llama-bench names it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceLabel {
    /// `CPU`, `CUDA` or `HIP`.
    pub backends: String,
    /// The GPU's name; empty on the CPU.
    pub gpu_info: String,
}

impl DeviceLabel {
    pub fn of(choice: &BackendChoice) -> DeviceLabel {
        match choice {
            BackendChoice::Cpu => DeviceLabel {
                backends: "CPU".into(),
                gpu_info: String::new(),
            },
            BackendChoice::Gpu(device) => DeviceLabel {
                backends: match device.platform() {
                    hip_ffi::PlatformKind::Nvidia => "CUDA",
                    _ => "HIP",
                }
                .into(),
                // A name the runtime cannot give leaves the field empty; the run goes on.
                gpu_info: device.name().unwrap_or_default(),
            },
        }
    }
}

impl RunSetup {
    /// The setup of a loaded session of the model `info` describes; `n_batch` is the most
    /// prompt rows a step takes.
    pub fn of_session<B: Backend>(
        session: &Session<B>,
        file: &GgufFile,
        info: &ModelInfo,
        device: &DeviceLabel,
        n_batch: usize,
    ) -> RunSetup {
        let on_gpu = session.backend().device_memory().is_some();
        RunSetup {
            backends: device.backends.clone(),
            gpu_info: device.gpu_info.clone(),
            cpu_info: cpu_model_name(),
            model_type: model_type(file, &session.spec().arch_name, info.params),
            n_threads: rayon::current_num_threads(),
            kv_type: session.backend().kv_type().to_string(),
            n_gpu_layers: if on_gpu { session.spec().n_layers } else { 0 },
            n_batch,
            flash_attn: on_gpu,
        }
    }
}

/// `llama 8.03 B Q4_K`: the architecture, the parameter count and the weight type that holds
/// the most bytes (llama-bench prints the file type's long name; this names the same thing).
pub fn model_type(file: &GgufFile, arch: &str, params: u64) -> String {
    let mut bytes_by_type: Vec<(String, u64)> = Vec::new();
    for t in file.tensors() {
        let name = t.ggml_type.to_string();
        match bytes_by_type.iter_mut().find(|(n, _)| *n == name) {
            Some((_, b)) => *b = b.saturating_add(t.n_bytes),
            None => bytes_by_type.push((name, t.n_bytes)),
        }
    }
    let most = bytes_by_type
        .into_iter()
        .max_by_key(|(_, b)| *b)
        .map(|(n, _)| n)
        .unwrap_or_default();
    format!("{arch} {} {most}", format_params(params))
}

/// The host CPU's model name from `/proc/cpuinfo`, or an empty string where there is none.
pub fn cpu_model_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|rest| rest.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_default()
}
