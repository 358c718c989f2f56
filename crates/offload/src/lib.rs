//! Pinned-host weight offload: which weights stay on the GPU and which are read from host
//! memory, under a byte budget that caps everything the run takes on the device.
//!
//! This crate holds the first part: the budget ([`Budget`], `--gpu-budget` /
//! `HIPDECODE_GPU_BUDGET`) and the planner ([`plan()`]), which reserves what must be resident,
//! fills the rest with the weights that gain most from the device, and predicts the decode
//! speed from a link model ([`LinkModel`]). The decode crate carries a plan out with kernels
//! reading mapped pinned host memory in place, splitting their products with the host's cores,
//! or streaming them into device slots by the copy engine (`decode::budget_run`). The link
//! model takes the rates that `hipdecode probe-link` and `probe-host` measured on this machine
//! where they were kept ([`measured`]).
//! docs/offload.md says what is and is not there.

pub mod budget;
pub mod knobs;
pub mod link;
pub mod measured;
pub mod plan;

pub use budget::{parse_size, Budget, BudgetError, BUDGET_FORMS};
pub use link::{InvalidLink, LinkModel};
pub use plan::{
    device_footprint, mib, minimum_budget, plan, Placement, PlacementSummary, Plan, PlanError,
    PlanRequest, PlanTag, PlannedTensor, ResidentNeeds, TensorKind, WeightTensor,
};

/// The README's examples, run as doc tests so the README stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
