//! A run under a GPU budget: the offload plan made for it, the allocator limit that enforces
//! it, and the weights it keeps in pinned host memory.
//!
//! The budget caps everything the run takes on the device. The plan (`offload::plan`) splits
//! it into what must be resident (the model's [`crate::layout::ModelLayout`], priced without
//! headroom: its figures are the ones the load allocates) and the weights that fit beside it. The run then behaves
//! like one on a card of that size: the allocator's memory limit is set to the budget less the
//! graph and runtime memory that the allocator does not see, so a load or step that would
//! overrun the budget fails there. The weights the plan leaves off the device stay in mapped
//! pinned host memory: decode reads them in place or streams them into the prefetch slots, as
//! the plan places each, and prefill streams them through the prefill's device slots (or reads
//! them in place with `HIPDECODE_OFFLOAD_PREFILL=in-place`). [`BudgetRun::summary`] prints the
//! plan, the limit and where the host weights are read.

use crate::backend::gpu::{CpuShare, HostPlacement};
use crate::device::{BackendChoice, GpuOffload};
use crate::error::{DecodeError, Result};
use crate::layout::{LayoutOptions, ModelLayout};
use gguf_loader::GgufFile;
use offload::{mib, Budget, LinkModel, Placement, Plan, PlanTag};
use std::sync::Arc;

pub static HOST_BUDGET: knobs::Knob<Option<u64>> = knobs::Knob {
    name: "HIPDECODE_HOST_BUDGET",
    default: "",
    doc: "caps the pinned host memory of offloaded weights when --host-budget is not given, \
          in bytes (\"32GiB\"; unset: 90% of the host's available memory)",
    scope: knobs::Scope::Run,
    parse: |v| offload::budget::parse_optional_size(HOST_BUDGET.name, v),
};

/// Share of the host's available memory that offloaded weights may pin when no host budget is
/// given. Pinned pages cannot be swapped or reclaimed, so pinning all of it would leave the
/// rest of the system (and this process's own file cache for the model) nothing.
pub const HOST_AVAILABLE_SHARE: f64 = 0.9;

/// A budget's plan and how the run carries it out.
#[derive(Clone, Debug)]
pub struct BudgetRun {
    /// The budget in bytes.
    pub budget: u64,
    /// Where the budget came from, for the report.
    pub budget_source: String,
    /// The planner's placement of every weight.
    pub plan: Plan,
    /// What the backend is given.
    pub offload: GpuOffload,
    /// Where the host budget came from, for the report.
    pub host_budget_source: String,
}

/// Everything [`prepare`] needs besides the model.
#[derive(Clone, Debug)]
pub struct BudgetRequest {
    /// The budget as given.
    pub budget: Budget,
    /// `--gpu-budget X` or the variable's name.
    pub budget_source: String,
    /// The host budget as given (`--host-budget`), else [`HOST_BUDGET`] is read.
    pub host_budget: Option<String>,
    /// The device's total memory (a percentage budget is a share of it).
    pub device_total: u64,
    /// The run's context and batch, which size what must be resident.
    pub options: LayoutOptions,
    /// How offloaded products split with the host (the run's GPU config), which the link
    /// model predicts with.
    pub cpu_share: CpuShare,
}

/// The link model the planner predicts with: the H200's rates, replaced by the ones
/// `hipdecode probe-link` and `probe-host` measured on this machine where they were kept
/// ([`offload::measured`]), with the host's cores adding
/// to zero-copy reads unless the hybrid split is off (`cpu_share`, the run's
/// [`crate::backend::gpu::GpuConfig::cpu_share`]).
pub fn default_link(cpu_share: CpuShare) -> Result<LinkModel> {
    let link = LinkModel::h200_default();
    let link = match cpu_share {
        CpuShare::Off => link.with_host_compute_gbps(0.0),
        _ => link,
    };
    // The rates hipdecode probe-link / probe-host measured on this machine, where kept.
    let invalid = |e: offload::measured::RatesError| DecodeError::InvalidArgument(e.to_string());
    match offload::measured::rates_path().map_err(invalid)? {
        Some(path) => Ok(offload::measured::MeasuredRates::load(&path)
            .map_err(invalid)?
            .apply(link)),
        None => Ok(link),
    }
}

pub static OFFLOAD_STREAM: knobs::Knob<bool> = knobs::Knob {
    name: "HIPDECODE_OFFLOAD_STREAM",
    default: "auto",
    doc: "whether the planner may stream weights for decode, copying them into device slots \
          where its link model says a copy beats reading in place: `auto` or `off`",
    scope: knobs::Scope::Run,
    parse: |v| knobs::parse::choice(v, &[("auto", true), ("off", false)]),
};

/// Whether decode may stream weights ([`OFFLOAD_STREAM`]).
pub fn stream_allowed() -> Result<bool> {
    Ok(OFFLOAD_STREAM.read()?)
}

/// The planner's request for a run of `layout` under `budget`: the layout's needs as they
/// are, streaming as [`OFFLOAD_STREAM`] allows. `hipdecode plan` uses it too, so it shows the
/// plan a run carries out.
pub fn plan_request(
    layout: &ModelLayout,
    budget: u64,
    link: LinkModel,
) -> Result<offload::PlanRequest<'_>> {
    let mut request = layout.plan_request(budget, link);
    request.allow_streamed = stream_allowed()?;
    Ok(request)
}

/// The budget from `flag` (named `--gpu-budget`), else from `HIPDECODE_GPU_BUDGET`, with its
/// source; `None` when neither is set.
pub fn budget_from(flag: Option<&str>) -> Result<Option<(Budget, String)>> {
    let invalid = |e: offload::BudgetError| DecodeError::InvalidArgument(e.to_string());
    Ok(match flag {
        Some(text) => Some((
            Budget::parse("--gpu-budget", text).map_err(invalid)?,
            format!("--gpu-budget {text}"),
        )),
        None => offload::knobs::GPU_BUDGET
            .read()?
            .map(|b| (b, offload::knobs::GPU_BUDGET.name.to_string())),
    })
}

/// The budget run for `choice`, when a budget is given (`gpu_budget`, else
/// `HIPDECODE_GPU_BUDGET`): `None` without one, an error naming the fix on the CPU backend.
pub fn for_choice(
    choice: &BackendChoice,
    file: &GgufFile,
    gpu_budget: Option<&str>,
    host_budget: Option<&str>,
    options: LayoutOptions,
    cpu_share: CpuShare,
) -> Result<Option<BudgetRun>> {
    let Some((budget, budget_source)) = budget_from(gpu_budget)? else {
        if host_budget.is_some() {
            return Err(DecodeError::InvalidArgument(
                "--host-budget bounds the weights a GPU budget leaves in host memory; give \
                 --gpu-budget too, or drop --host-budget"
                    .into(),
            ));
        }
        return Ok(None);
    };
    let BackendChoice::Gpu(device) = choice else {
        return Err(DecodeError::InvalidArgument(format!(
            "a GPU budget ({budget_source}) applies to the GPU backend, but this run is on the \
             CPU; use --device gpu, or drop the budget"
        )));
    };
    let device_total = device
        .mem_get_info()
        .map_err(|e| DecodeError::Gpu(format!("reading device memory: {e}")))?
        .total;
    prepare(
        file,
        &BudgetRequest {
            budget,
            budget_source,
            host_budget: host_budget.map(str::to_string),
            device_total,
            options,
            cpu_share,
        },
    )
    .map(Some)
}

/// Plans `file` under the request's budget and works out how the run carries the plan out.
/// A budget below what must be resident is the planner's refusal, naming the minimum.
pub fn prepare(file: &GgufFile, req: &BudgetRequest) -> Result<BudgetRun> {
    let invalid = |e: &dyn std::fmt::Display| DecodeError::InvalidArgument(e.to_string());
    let memory_limit = &rocm_alloc::knobs::MEMORY_LIMIT;
    if memory_limit.is_set() {
        return Err(DecodeError::InvalidArgument(format!(
            "{} and a GPU budget are both set; the budget sets the allocator's memory limit \
             itself, so unset {} or drop the budget",
            memory_limit.name, memory_limit.name
        )));
    }
    let budget = req
        .budget
        .resolve(Some(req.device_total))
        .map_err(|e| invalid(&e))?;
    let layout = ModelLayout::new(file, &req.options)?;
    let plan = offload::plan(&plan_request(
        &layout,
        budget,
        default_link(req.cpu_share)?,
    )?)
    .map_err(|e| invalid(&e))?;
    let mut host = std::collections::HashMap::new();
    let mut device_weight_bytes = 0u64;
    for t in &plan.tensors {
        match t.placement {
            Placement::Device => {
                device_weight_bytes += crate::backend::gpu::weight_piece_bytes(t.tensor.bytes);
            }
            // Both are pinned; decode reads the first in place and copies the second into the
            // prefetch slots, as each weight's read path (chosen at load) says.
            Placement::HostZeroCopy | Placement::Streamed => {
                host.insert(t.tensor.name.clone(), t.placement);
            }
        }
    }
    let (host_budget, host_budget_source) = host_budget(req.host_budget.as_deref())?;
    if plan.host_bytes() > host_budget {
        return Err(DecodeError::InvalidArgument(format!(
            "the plan keeps {} MiB of weights in pinned host memory, above the host budget of \
             {} MiB ({host_budget_source}); raise the host budget (--host-budget or {}) or the \
             GPU budget",
            mib(plan.host_bytes()),
            mib(host_budget),
            HOST_BUDGET.name
        )));
    }
    // Graphs, modules and the runtime's buffers take device memory the allocator never sees;
    // the plan counts them under `graph`, so the allocator gets the rest.
    let memory_limit = budget.saturating_sub(plan.tag(PlanTag::Graph));
    Ok(BudgetRun {
        budget,
        budget_source: req.budget_source.clone(),
        offload: GpuOffload {
            memory_limit,
            host: Arc::new(HostPlacement {
                placements: host,
                stream_slot_bytes: plan.staging_slot,
                device_weight_bytes,
                host_budget,
            }),
        },
        plan,
        host_budget_source,
    })
}

/// The host budget in bytes and where it came from: the flag, the variable, or a share of the
/// host's available memory.
fn host_budget(flag: Option<&str>) -> Result<(u64, String)> {
    let invalid = |e: offload::BudgetError| DecodeError::InvalidArgument(e.to_string());
    if let Some(text) = flag {
        let bytes = offload::parse_size("--host-budget", text).map_err(invalid)?;
        return Ok((bytes, format!("--host-budget {text}")));
    }
    unflagged_host_budget()
}

/// The host budget without `--host-budget`: `HIPDECODE_HOST_BUDGET`, else a share of the host's
/// available memory, with its source. It also bounds what a run without a GPU budget pins (the
/// embedding table the GPU backend keeps on the host).
pub(crate) fn unflagged_host_budget() -> Result<(u64, String)> {
    if let Some(bytes) = HOST_BUDGET.read()? {
        return Ok((bytes, HOST_BUDGET.name.to_string()));
    }
    let available = crate::memory::host_available().ok_or_else(|| {
        DecodeError::InvalidArgument(format!(
            "the host's available memory could not be read from /proc/meminfo; give the \
             pinned host memory a bound with --host-budget or {}",
            HOST_BUDGET.name
        ))
    })?;
    let bytes = (available as f64 * HOST_AVAILABLE_SHARE) as u64;
    Ok((
        bytes,
        format!(
            "{:.0}% of the {} MiB available on the host",
            HOST_AVAILABLE_SHARE * 100.0,
            mib(available)
        ),
    ))
}

impl BudgetRun {
    /// The report printed before the run: the plan per tag and placement, how it is enforced,
    /// and where the weights left off the device are read.
    pub fn summary(&self) -> String {
        let [_, zero_copy, streamed] = self.plan.by_placement();
        let prefill = match self.plan.tag(PlanTag::OffloadStaging) {
            0 => "prefill reads them in place".to_string(),
            b => format!(
                "prefill streams them through {} MiB of device slots",
                mib(b)
            ),
        };
        format!(
            "gpu budget {} MiB from {}\n{}\nenforced: the allocator's memory limit is {} MiB \
             (the budget less {} MiB of graph and runtime memory outside the allocator)\n\
             host: {} weight tensors ({} MiB) in mapped pinned host memory, read in place by \
             decode, and {} ({} MiB) that decode streams into the slots; {prefill}; host \
             budget {} MiB ({})\n",
            mib(self.budget),
            self.budget_source,
            self.plan,
            mib(self.offload.memory_limit),
            mib(self.plan.tag(PlanTag::Graph)),
            zero_copy.tensors,
            mib(zero_copy.bytes),
            streamed.tensors,
            mib(streamed.bytes),
            mib(self.offload.host.host_budget),
            self.host_budget_source,
        )
    }
}
