//! Choosing where a model runs: one enum for the CLI, bench-decode and the tests.

use crate::backend::cpu::CpuBackend;
use crate::backend::gpu::{GpuBackend, GpuConfig, HostPlacement, DEFAULT_MAX_BATCH};
use crate::backend::{Backend, Precision};
use crate::error::{DecodeError, Result};
use crate::kv::KvType;
use std::path::Path;
use std::sync::Arc;

/// What the GPU backend needs to carry out a budget's plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuOffload {
    /// The allocator's memory limit in bytes.
    pub memory_limit: u64,
    /// The weights read in place from pinned host memory, and the host budget.
    pub host: Arc<HostPlacement>,
}

/// What the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceRequest {
    /// A GPU when one is present and usable, else the CPU.
    #[default]
    Auto,
    Cpu,
    Gpu,
}

impl std::str::FromStr for DeviceRequest {
    type Err = DecodeError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(DeviceRequest::Auto),
            "cpu" => Ok(DeviceRequest::Cpu),
            "gpu" => Ok(DeviceRequest::Gpu),
            other => Err(DecodeError::InvalidArgument(format!(
                "--device '{other}' is not one of auto, cpu, gpu"
            ))),
        }
    }
}

/// The backend a run will use, with what it needs to be built.
#[derive(Clone, Debug)]
pub enum BackendChoice {
    /// The CPU reference backend.
    Cpu,
    /// The GPU backend on this device.
    Gpu(hip_ffi::Device),
}

/// Where the model will run, and why.
#[derive(Clone, Debug)]
pub struct DeviceChoice {
    pub backend: BackendChoice,
    /// Something the user should know about the choice (a GPU passed over, and why).
    pub note: Option<String>,
}

/// Whether a GPU driver node is present (AMD's KFD, or NVIDIA's control device).
pub fn gpu_present() -> bool {
    Path::new("/dev/kfd").exists() || Path::new("/dev/nvidiactl").exists()
}

/// The first usable GPU, or what was probed and why it cannot be used.
pub fn probe_gpu() -> std::result::Result<hip_ffi::Device, String> {
    hip_ffi::Platform::default_device()
}

/// Resolves a request: `gpu` is an error naming what was probed when no GPU is usable; `auto`
/// takes a usable GPU, else the CPU (with a note when a GPU was present but unusable).
pub fn choose(request: DeviceRequest) -> Result<DeviceChoice> {
    choose_with(request, probe_gpu)
}

fn choose_with(
    request: DeviceRequest,
    probe: impl FnOnce() -> std::result::Result<hip_ffi::Device, String>,
) -> Result<DeviceChoice> {
    match request {
        DeviceRequest::Cpu => Ok(DeviceChoice {
            backend: BackendChoice::Cpu,
            note: None,
        }),
        DeviceRequest::Gpu => match probe() {
            Ok(device) => Ok(DeviceChoice {
                backend: BackendChoice::Gpu(device),
                note: None,
            }),
            Err(reason) => Err(DecodeError::GpuUnavailable(reason)),
        },
        DeviceRequest::Auto => Ok(match probe() {
            Ok(device) => DeviceChoice {
                backend: BackendChoice::Gpu(device),
                note: None,
            },
            Err(reason) => DeviceChoice {
                backend: BackendChoice::Cpu,
                note: gpu_present().then(|| {
                    format!("a GPU is present but unusable ({reason}); running on the CPU")
                }),
            },
        }),
    }
}

/// Work that runs on whichever backend was chosen (the backends have different buffer types,
/// so the work is generic rather than the backend boxed).
pub trait WithBackend {
    /// What the work returns.
    type Output;
    /// Runs the work on `backend`.
    fn run<B: Backend>(self, backend: B) -> Self::Output;
}

/// Settings that only one backend has.
#[derive(Clone, Debug)]
pub struct BackendSettings {
    /// CPU: quantized 16-bit activations (fast) or f32 (exact).
    pub cpu_precision: Precision,
    /// GPU: the most tokens one step may carry (prefill runs in chunks of this).
    pub gpu_max_batch: usize,
    /// GPU: capture decode steps into graphs and replay them (`--no-graph` turns it off).
    pub gpu_graphs: bool,
    /// GPU: a GPU budget's plan carried out (the allocator's limit, the weights kept in
    /// pinned host memory); see [`crate::budget_run`].
    pub gpu_offload: Option<GpuOffload>,
    /// GPU: the knobs' settings, read once by the program; `None` reads the process
    /// environment when the backend opens.
    pub gpu_config: Option<GpuConfig>,
    /// The KV cache's type (`-ctk` / `-ctv`); `None` is the backend's default (f32 on the
    /// CPU, f16 on the GPU). It overrides `gpu_config`'s.
    pub kv_type: Option<KvType>,
}

impl Default for BackendSettings {
    fn default() -> Self {
        BackendSettings {
            cpu_precision: Precision::Fast,
            gpu_max_batch: DEFAULT_MAX_BATCH,
            gpu_graphs: true,
            gpu_offload: None,
            gpu_config: None,
            kv_type: None,
        }
    }
}

impl BackendChoice {
    /// A short name for reports: `cpu` or `gpu`.
    pub fn name(&self) -> &'static str {
        match self {
            BackendChoice::Cpu => "cpu",
            BackendChoice::Gpu(_) => "gpu",
        }
    }

    /// Builds the chosen backend and runs `work` on it.
    pub fn run<W: WithBackend>(&self, settings: BackendSettings, work: W) -> Result<W::Output> {
        Ok(match self {
            BackendChoice::Cpu if settings.gpu_offload.is_some() => {
                return Err(DecodeError::InvalidArgument(
                    "a GPU budget applies to the GPU backend, but this run is on the CPU; use \
                     --device gpu, or drop --gpu-budget and HIPDECODE_GPU_BUDGET"
                        .into(),
                ))
            }
            BackendChoice::Cpu => work.run(cpu_backend(&settings)),
            BackendChoice::Gpu(device) => work.run(gpu_backend(*device, &settings)?),
        })
    }
}

/// The CPU backend as `settings` ask: its precision and KV cache type.
pub fn cpu_backend(settings: &BackendSettings) -> CpuBackend {
    let mut cpu = CpuBackend::new(settings.cpu_precision);
    if let Some(kv) = settings.kv_type {
        cpu.set_kv_type(kv);
    }
    cpu
}

/// The GPU backend on `device` as `settings` ask, a GPU budget's plan included.
pub fn gpu_backend(device: hip_ffi::Device, settings: &BackendSettings) -> Result<GpuBackend> {
    let limit = settings.gpu_offload.as_ref().map(|o| o.memory_limit);
    let mut config = match settings.gpu_config {
        Some(config) => config,
        None => GpuConfig::from_process()?,
    };
    if let Some(kv) = settings.kv_type {
        config.kv_type = kv;
    }
    let (max_batch, graphs) = (settings.gpu_max_batch, settings.gpu_graphs);
    let mut backend = GpuBackend::with_config(device, max_batch, graphs, limit, &config)?;
    if let Some(offload) = &settings.gpu_offload {
        backend.set_host_placement((*offload.host).clone())?;
    }
    Ok(backend)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_request_names_the_probe_and_auto_falls_back() {
        let e = choose_with(DeviceRequest::Gpu, || {
            Err("no libamdhip64, no libcuda".into())
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("no libamdhip64, no libcuda"), "{e}");
        assert!(e.contains("--device cpu"), "{e}");
        let auto = choose_with(DeviceRequest::Auto, || Err("none".into())).unwrap();
        assert!(matches!(auto.backend, BackendChoice::Cpu));
        let cpu = choose_with(DeviceRequest::Cpu, || panic!("cpu must not probe")).unwrap();
        assert!(matches!(cpu.backend, BackendChoice::Cpu));
        assert!("tpu".parse::<DeviceRequest>().is_err());
    }
}
