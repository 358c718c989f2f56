//! The planner: what stays on the device, what is read from host memory, and how fast that
//! decodes.
//!
//! # What it does
//!
//! 1. It reserves what must be resident whatever happens to the weights ([`ResidentNeeds`]):
//!    the KV cache, activations, workspace, graph and runtime memory, the allocator's slack and
//!    any fixed offload staging. A budget below that is refused ([`PlanError::BelowMinimum`]),
//!    naming the minimum. Weights read from host memory in place need no device memory, so
//!    this is the minimum: it is what a run with every weight on the host takes.
//! 2. It fills the rest with weights, ranked by the time a resident byte saves per token:
//!    `(time to read it from the host - time to read it on the device) / bytes resident`. With
//!    one link rate that is proportional to *bytes read per token per byte resident*: 1 for a
//!    dense or shared tensor (read whole every token), `n_used / n_expert` for an MoE expert
//!    stack, `1 / rows` for an embedding table that is only looked up. Dense and shared tensors
//!    therefore rank before experts, and experts before lookup tables. Ties go to the smaller
//!    tensor, so a run of equal-ranked tensors fills with as many as fit.
//! 3. Each weight off the device is read in place from mapped pinned host memory
//!    ([`Placement::HostZeroCopy`]) or copied whole into a double-buffered device staging area
//!    and read there ([`Placement::Streamed`]), whichever the link model says is faster for it.
//!    Streaming costs two staging buffers of the largest streamed tensor's size, so the planner
//!    tries each staging size (none, or one per distinct size of a tensor that streams faster
//!    than it is read in place) and keeps the fastest plan.
//!
//! # The time model
//!
//! Time per decode token is the bytes each tensor contributes, divided by the rate of the path
//! it takes (see [`LinkModel`]):
//!
//! - on the device: `read / device_read`
//! - read in place from the host: `read / (zero_copy_read + host_compute)` (the GPU's zero-copy
//!   reads and, with the hybrid split, the host's cores sharing the rows)
//! - streamed: `bytes / copy + read / device_read` (the whole tensor crosses the link, then
//!   the kernel reads what it needs from the staging copy)
//!
//! where `read` is the bytes a token reads ([`WeightTensor::read_per_token`]), plus the other
//! bytes every token reads on the device (the KV cache) at `device_read`. Nothing overlaps in
//! this model and launches and arithmetic cost nothing, so the prediction is a bandwidth bound:
//! today's GPU path reaches about a quarter of it on an 8B model, and its use is to compare
//! budgets with each other, not to promise a speed.
//!
//! # Monotonicity
//!
//! A larger budget never plans a slower run. For every staging size the planner takes the
//! faster of two device sets, each monotone in the budget:
//!
//! - the greedy fill down the ranking (every tensor that still fits). Ranked by density, it is
//!   monotone: at the first tensor `X` where the fills of two budgets differ, `X` fits only the
//!   larger one, and what the smaller budget places from `X` on is no denser than `X` and
//!   smaller in total, so it saves less than `X` alone;
//! - the fastest member that fits of a family that does not depend on the budget: "the first
//!   `k` tensors of the ranking, then those from position `j >= k` to `e`", which covers "this
//!   class is full, carry on with the next" and "skip one large tensor so several smaller ones
//!   fit". A larger budget admits a superset of it.
//!
//! The fastest of monotone choices is monotone, across staging sizes too. Times are sums of
//! per-tensor integers (femtoseconds), so every comparison is exact, not subject to float
//! rounding. Ranking by time saved per token rather than per resident byte breaks the greedy
//! half; the property test in `tests/planner.rs` catches that.

use crate::link::{InvalidLink, LinkModel};
use rocm_alloc::size_class;
use std::fmt;

const MIB: f64 = (1u64 << 20) as f64;
/// Femtoseconds per second: per-tensor times are integers in this unit.
const FS_PER_S: f64 = 1e15;

/// What streaming one tensor costs beyond its bytes, femtoseconds: the copy's launch and the
/// two event waits that order it between the streams (about 10 µs, assumed). It keeps small
/// tensors (norms, biases), whose copy would take less than that, read in place.
pub const STREAM_OVERHEAD_FS: u128 = 10_000_000_000;

/// How a token reads a weight tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorKind {
    /// A tensor of one layer that every token reads whole: attention and dense FFN matrices,
    /// the layer's norms and biases, an MoE layer's router.
    Dense,
    /// A tensor outside the layers that every token reads whole: the output projection, the
    /// final norm, RoPE frequency factors, and the embedding table when it is also the output
    /// projection.
    Shared,
    /// A stack of `n_expert` expert matrices of which each token reads `n_used`.
    Experts {
        /// Experts in the stack.
        n_expert: u32,
        /// Experts each token reads.
        n_used: u32,
    },
    /// An embedding table that is only looked up: each token reads one of its `rows` rows.
    Lookup {
        /// Rows (the vocabulary).
        rows: u64,
    },
}

impl TensorKind {
    /// A short name for listings.
    pub fn name(self) -> &'static str {
        match self {
            TensorKind::Dense => "dense",
            TensorKind::Shared => "shared",
            TensorKind::Experts { .. } => "experts",
            TensorKind::Lookup { .. } => "lookup",
        }
    }
}

/// One weight tensor as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightTensor {
    /// The tensor's name (`blk.3.attn_q.weight`).
    pub name: String,
    /// Bytes it occupies where it lives, as the backend stores it (on the GPU backend a norm
    /// vector is f32 whatever the file holds; a matrix keeps its quantized blocks).
    pub bytes: u64,
    /// The layer it belongs to, if any.
    pub layer: Option<u32>,
    /// How a token reads it.
    pub kind: TensorKind,
}

impl WeightTensor {
    /// Bytes a decode token reads from this tensor: all of it for dense and shared tensors,
    /// `n_used / n_expert` of an expert stack (rounded up), one row of a lookup table (rounded
    /// up).
    pub fn read_per_token(&self) -> u64 {
        let b = self.bytes as u128;
        let read = match self.kind {
            TensorKind::Dense | TensorKind::Shared => b,
            TensorKind::Experts { n_expert, n_used } => {
                (b * n_used as u128).div_ceil((n_expert as u128).max(1))
            }
            TensorKind::Lookup { rows } => b.div_ceil((rows as u128).max(1)),
        };
        read.min(b) as u64
    }

    fn check(&self) -> Result<(), PlanError> {
        let problem = match self.kind {
            TensorKind::Experts { n_expert: 0, .. } => "an expert stack with 0 experts",
            TensorKind::Experts { n_used: 0, .. } => {
                "an expert stack of which no token reads any expert"
            }
            TensorKind::Experts { n_expert, n_used } if n_used > n_expert => {
                "an expert stack with more experts used per token than it holds"
            }
            TensorKind::Lookup { rows: 0 } => "a lookup table of 0 rows",
            _ => return Ok(()),
        };
        Err(PlanError::InvalidTensor {
            name: self.name.clone(),
            problem: problem.to_string(),
        })
    }
}

/// What must be on the device whatever happens to the weights, in bytes per tag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResidentNeeds {
    /// Keys and values for the requested context.
    pub kv_cache: u64,
    /// Per-step activation buffers and their 8-bit copies.
    pub activations: u64,
    /// Kernel workspace (attention partials, argmax, MoE scratch, vendor-GEMM buffers).
    pub workspace: u64,
    /// Captured graphs and what the runtime holds outside the allocator (kernel modules).
    pub graph: u64,
    /// What the allocator holds beyond the bytes asked of it: rounding, segment tails, cache.
    pub allocator_slack: u64,
    /// Staging that offload needs as soon as one weight stays on the host, whatever the
    /// placements (the prefill's streamed prefetch); a plan that keeps every weight on the
    /// device leaves it out. The decode streaming double buffer is planned on top.
    pub offload_staging: u64,
}

impl ResidentNeeds {
    /// The sum, or `None` when it overflows.
    pub fn total(&self) -> Option<u64> {
        [
            self.kv_cache,
            self.activations,
            self.workspace,
            self.graph,
            self.allocator_slack,
            self.offload_staging,
        ]
        .iter()
        .try_fold(0u64, |a, &b| a.checked_add(b))
    }
}

/// The tags a plan accounts for. All but `AllocatorSlack` are rocm-alloc tags ([`PlanTag::alloc_tag`]
/// maps them); slack is what the allocator reserves beyond its blocks, which its report shows as
/// reserved minus active. That line is why this cannot be rocm-alloc's `Tag` itself: no
/// allocation carries it, so the allocator's enum has no place for it, and giving it one would
/// let a buffer be tagged as slack. rocm-alloc's `Other` has no plan line: nothing the plan
/// prices is untagged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlanTag {
    Weights,
    KvCache,
    Activations,
    Workspace,
    Graph,
    AllocatorSlack,
    OffloadStaging,
}

impl PlanTag {
    /// Number of tags.
    pub const COUNT: usize = 7;
    /// Every tag, in report order.
    pub const ALL: [PlanTag; PlanTag::COUNT] = [
        PlanTag::Weights,
        PlanTag::KvCache,
        PlanTag::Activations,
        PlanTag::Workspace,
        PlanTag::Graph,
        PlanTag::AllocatorSlack,
        PlanTag::OffloadStaging,
    ];

    /// The name in reports (rocm-alloc's tag name where there is one).
    pub fn name(self) -> &'static str {
        match self.alloc_tag() {
            Some(tag) => tag.name(),
            None => "allocator_slack",
        }
    }

    /// The allocator tag these bytes are counted under, `None` for the slack.
    pub fn alloc_tag(self) -> Option<rocm_alloc::Tag> {
        use rocm_alloc::Tag;
        Some(match self {
            PlanTag::Weights => Tag::Weights,
            PlanTag::KvCache => Tag::KvCache,
            PlanTag::Activations => Tag::Activations,
            PlanTag::Workspace => Tag::Workspace,
            PlanTag::Graph => Tag::Graph,
            PlanTag::OffloadStaging => Tag::OffloadStaging,
            PlanTag::AllocatorSlack => return None,
        })
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Where a weight tensor lives during decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Device memory.
    Device,
    /// Mapped pinned host memory, read in place by the kernels.
    HostZeroCopy,
    /// Pinned host memory, copied into device staging before the kernel that reads it.
    Streamed,
}

impl Placement {
    /// Every placement, in report order.
    pub const ALL: [Placement; 3] = [
        Placement::Device,
        Placement::HostZeroCopy,
        Placement::Streamed,
    ];

    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Device => "device",
            Placement::HostZeroCopy => "host zero-copy",
            Placement::Streamed => "streamed",
        }
    }
}

/// The planner's input.
#[derive(Clone, Debug)]
pub struct PlanRequest<'a> {
    /// Every weight tensor the model loads.
    pub tensors: &'a [WeightTensor],
    /// What is reserved before any weight.
    pub needs: ResidentNeeds,
    /// The budget in bytes (resolved; see [`crate::Budget::resolve`]).
    pub budget: u64,
    /// The rates the prediction uses.
    pub link: LinkModel,
    /// Bytes every token reads on the device besides the weights (the KV cache at the run's
    /// average position). The same in every plan: it moves the prediction, not the placement.
    pub other_device_reads_per_token: u64,
    /// Whether [`Placement::Streamed`] may be chosen. The runtime has no streaming mechanism
    /// yet, so the plans it carries out are made with `false`: every weight off the device is
    /// then read in place ([`Placement::HostZeroCopy`]).
    pub allow_streamed: bool,
    /// Whether lookup tables ([`TensorKind::Lookup`]) stay in host memory, read in place,
    /// whatever the budget. A token reads one row of such a table, a few KiB, so the device
    /// saves its whole size (281 MiB for Llama 3.1 8B's embedding at Q4_K) for a read that
    /// costs microseconds over the link. The budget then plans only the other tensors, and no
    /// host staging is needed for the tables: no product reads them.
    pub lookups_on_host: bool,
}

/// Why no plan was made. Each message says what to change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// The budget does not hold what must be resident.
    #[error(
        "a GPU budget of {budget_mib:.1} MiB is below the minimum of {minimum_mib:.1} MiB that \
         this run needs with every weight left in host memory ({breakdown}); raise the budget \
         (--gpu-budget or HIPDECODE_GPU_BUDGET) to at least {minimum_mib:.1}MiB, or ask for a \
         shorter context"
    )]
    BelowMinimum {
        /// The budget in bytes.
        budget: u64,
        /// The minimum in bytes.
        minimum: u64,
        /// The budget in MiB.
        budget_mib: f64,
        /// The minimum in MiB, rounded up to the tenth shown.
        minimum_mib: f64,
        /// The minimum per tag.
        breakdown: String,
    },
    /// A rate of the link model is unusable.
    #[error(transparent)]
    Link(#[from] InvalidLink),
    /// A tensor description is contradictory.
    #[error("tensor {name:?} is {problem}; describe it as dense, shared, an expert stack with 1 <= used <= experts, or a lookup table of at least one row")]
    InvalidTensor {
        /// The tensor.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// Byte counts beyond 64 bits: no device or host holds that much.
    #[error("the {what} overflow 64 bits; no device holds that much, so the input is wrong")]
    Overflow {
        /// Which sum.
        what: &'static str,
    },
}

/// One tensor's part of a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedTensor {
    /// The tensor as given.
    pub tensor: WeightTensor,
    /// Where it lives.
    pub placement: Placement,
    /// Its place in the ranking (1 = first on the device); tensors that gain nothing from
    /// the device come last. One MoE layer's expert stacks share a place: they are placed
    /// together.
    pub rank: usize,
    /// Bytes it takes on the device when resident: its size rounded as the allocator rounds.
    pub device_footprint: u64,
    /// Bytes a token reads from it.
    pub read_per_token: u64,
    /// Its share of the predicted time per token, in femtoseconds.
    pub time_fs: u128,
}

/// A plan: placements, bytes per tag and the prediction.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The budget it was made for.
    pub budget: u64,
    /// The smallest budget any plan needs (every weight in host memory).
    pub minimum: u64,
    /// Every tensor, in input order.
    pub tensors: Vec<PlannedTensor>,
    /// Device bytes per tag, indexed as [`PlanTag::ALL`]; they sum to at most the budget.
    pub tags: [u64; PlanTag::COUNT],
    /// Size of one of the two staging buffers for streamed tensors (0 when none streams).
    pub staging_slot: u64,
    /// Bytes every token reads on the device besides the weights.
    pub other_device_reads_per_token: u64,
    /// Predicted time per token on the device (weights resident or streamed, and the other
    /// reads), in femtoseconds.
    pub device_time_fs: u128,
    /// Predicted time per token on the host link, in femtoseconds.
    pub link_time_fs: u128,
    /// The rates used.
    pub link: LinkModel,
}

/// Totals of one placement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlacementSummary {
    /// Tensors placed so.
    pub tensors: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes a token reads from them.
    pub read_per_token: u64,
    /// Their time per token, in femtoseconds.
    pub time_fs: u128,
}

impl Plan {
    /// Bytes of one tag.
    pub fn tag(&self, tag: PlanTag) -> u64 {
        self.tags[tag.index()]
    }

    /// Device bytes of the whole plan (at most the budget).
    pub fn total(&self) -> u64 {
        self.tags.iter().sum()
    }

    /// Predicted time per token, in femtoseconds.
    pub fn time_per_token_fs(&self) -> u128 {
        self.device_time_fs.saturating_add(self.link_time_fs)
    }

    /// Predicted decode tokens per second (infinite for a model that reads nothing).
    pub fn tokens_per_second(&self) -> f64 {
        match self.time_per_token_fs() {
            0 => f64::INFINITY,
            t => FS_PER_S / t as f64,
        }
    }

    /// Totals per placement, indexed as [`Placement::ALL`].
    pub fn by_placement(&self) -> [PlacementSummary; 3] {
        let mut out = [PlacementSummary::default(); 3];
        for t in &self.tensors {
            let i = Placement::ALL
                .iter()
                .position(|&p| p == t.placement)
                .unwrap_or(0);
            let s = &mut out[i];
            s.tensors += 1;
            s.bytes = s.bytes.saturating_add(t.tensor.bytes);
            s.read_per_token = s.read_per_token.saturating_add(t.read_per_token);
            s.time_fs = s.time_fs.saturating_add(t.time_fs);
        }
        out
    }

    /// Pinned host memory the plan needs: every tensor that is not on the device.
    pub fn host_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .filter(|t| t.placement != Placement::Device)
            .map(|t| t.tensor.bytes)
            .fold(0u64, u64::saturating_add)
    }

    /// One line per tensor, in ranking order: rank, placement, kind, MiB, read per token.
    pub fn tensor_listing(&self) -> String {
        let mut rows: Vec<&PlannedTensor> = self.tensors.iter().collect();
        rows.sort_by_key(|t| t.rank);
        let mut out = format!(
            "{:>5}  {:<15} {:<8} {:>10} {:>14}  tensor\n",
            "rank", "placement", "kind", "MiB", "read/token MiB"
        );
        for t in rows {
            out.push_str(&format!(
                "{:>5}  {:<15} {:<8} {:>10} {:>14}  {}\n",
                t.rank,
                t.placement.name(),
                t.tensor.kind.name(),
                mib(t.tensor.bytes),
                mib(t.read_per_token),
                t.tensor.name
            ));
        }
        out
    }
}

/// MiB with one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / MIB)
}

/// MiB rounded up to the tenth shown, so that a minimum written back as a budget holds.
fn mib_rounded_up(bytes: u64) -> f64 {
    (bytes as f64 / MIB * 10.0).ceil() / 10.0
}

fn ms(fs: u128) -> String {
    format!("{:.3}", fs as f64 / 1e12)
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.total();
        writeln!(
            f,
            "device memory by tag (MiB), budget {} MiB, minimum {:.1} MiB:",
            mib(self.budget),
            mib_rounded_up(self.minimum)
        )?;
        for tag in PlanTag::ALL {
            writeln!(f, "  {:<16} {:>10}", tag.name(), mib(self.tag(tag)))?;
        }
        writeln!(
            f,
            "  {:<16} {:>10}   ({} MiB of the budget unused)",
            "total",
            mib(total),
            mib(self.budget.saturating_sub(total))
        )?;
        writeln!(f, "weights by placement:")?;
        writeln!(
            f,
            "  {:<16} {:>7} {:>10} {:>15} {:>12}",
            "placement", "tensors", "MiB", "read/token MiB", "ms/token"
        )?;
        for (p, s) in Placement::ALL.iter().zip(self.by_placement()) {
            writeln!(
                f,
                "  {:<16} {:>7} {:>10} {:>15} {:>12}",
                p.name(),
                s.tensors,
                mib(s.bytes),
                mib(s.read_per_token),
                ms(s.time_fs)
            )?;
        }
        let other = other_time_fs(self.other_device_reads_per_token, &self.link);
        writeln!(
            f,
            "  {:<16} {:>7} {:>10} {:>15} {:>12}",
            "kv cache reads",
            "",
            "",
            mib(self.other_device_reads_per_token),
            ms(other)
        )?;
        if self.staging_slot > 0 {
            writeln!(
                f,
                "streaming through two staging buffers of {} MiB ({} bytes) each",
                mib(self.staging_slot),
                self.staging_slot
            )?;
        }
        writeln!(
            f,
            "pinned host memory for offloaded weights: {} MiB",
            mib(self.host_bytes())
        )?;
        writeln!(
            f,
            "predicted {:.1} tok/s: {} ms per token ({} ms on the device, {} ms on the host link)",
            self.tokens_per_second(),
            ms(self.time_per_token_fs()),
            ms(self.device_time_fs),
            ms(self.link_time_fs)
        )?;
        writeln!(f, "link model: {}", self.link)?;
        write!(
            f,
            "the prediction is a bandwidth bound (bytes / rate, nothing overlapped, launches free): \
             compare budgets with it, do not read it as a promised speed"
        )
    }
}

/// Bytes a tensor takes on the device when it is allocated alone: the allocator's rounding to
/// 512-byte blocks, and for requests of 10 MiB and more their own segment rounded to 2 MiB
/// (rocm-alloc's `size_class`). Smaller requests share segments; the tails of those are in
/// the resident needs' allocator slack. `None` when the size overflows.
pub fn device_footprint(bytes: u64) -> Option<u64> {
    let rounded = size_class::round_request(bytes.max(1))?;
    if rounded >= size_class::MIN_LARGE_ALLOC {
        rounded.checked_next_multiple_of(size_class::ROUND_LARGE)
    } else {
        Some(rounded)
    }
}

/// The smallest budget a run with these needs accepts: every need, with every weight read
/// from host memory in place (which needs no device memory).
pub fn minimum_budget(needs: &ResidentNeeds) -> Result<u64, PlanError> {
    needs.total().ok_or(PlanError::Overflow {
        what: "resident needs",
    })
}

/// Femtoseconds to move `bytes` at `rate` bytes per second.
fn fs(bytes: u64, rate: f64) -> u128 {
    let t = (bytes as f64 * FS_PER_S / rate).round();
    if t.is_finite() && t >= 0.0 {
        t as u128
    } else {
        u128::MAX
    }
}

fn other_time_fs(bytes: u64, link: &LinkModel) -> u128 {
    fs(bytes, link.device_read)
}

/// A tensor's costs, fixed for the whole planning.
struct Item {
    footprint: u64,
    read: u64,
    on_device: u128,
    zero_copy: u128,
    streamed: u128,
}

impl Item {
    fn streams_faster(&self) -> bool {
        self.streamed < self.zero_copy
    }
}

/// One staging size's ranking and prefix sums.
struct Ranking {
    /// Bytes of one staging buffer (0: nothing streams).
    slot: u64,
    /// Device bytes of the two buffers, as the allocator rounds them.
    staging: u64,
    /// Units in ranking order (only those the device speeds up): each a list of tensor
    /// indices placed together (see [`units`]).
    order: Vec<Vec<usize>>,
    /// Prefix sums of footprints and of time saved, over `order`.
    size: Vec<u128>,
    saved: Vec<u128>,
    /// Time per token with every tensor off the device.
    all_off: u128,
}

impl Ranking {
    fn off_cost(items: &[Item], tensors: &[WeightTensor], slot: u64, i: usize) -> u128 {
        let it = &items[i];
        if slot > 0 && it.streams_faster() && tensors[i].bytes <= slot {
            it.streamed
        } else {
            it.zero_copy
        }
    }

    /// `shared`: device bytes of staging the needs hold already (the prefill's slots), which
    /// the streaming double buffer reuses.
    fn new(
        items: &[Item],
        tensors: &[WeightTensor],
        units: &[Vec<usize>],
        slot: u64,
        other: u128,
        shared: u64,
    ) -> Option<Ranking> {
        let staging = if slot == 0 {
            0
        } else {
            device_footprint(slot)?
                .checked_mul(2)?
                .saturating_sub(shared)
        };
        let saved_by =
            |i: usize| Self::off_cost(items, tensors, slot, i).saturating_sub(items[i].on_device);
        let unit_saved = |u: &[usize]| {
            u.iter()
                .map(|&i| saved_by(i))
                .fold(0u128, u128::saturating_add)
        };
        let unit_size = |u: &[usize]| u.iter().map(|&i| items[i].footprint as u128).sum::<u128>();
        let mut order: Vec<Vec<usize>> = units
            .iter()
            .filter(|u| unit_saved(u) > 0)
            .cloned()
            .collect();
        // Time saved per resident byte, descending (compared exactly: a * d vs b * c), then
        // the smaller unit, then input order.
        order.sort_by(|a, b| {
            let (sa, sb) = (unit_saved(a), unit_saved(b));
            let (fa, fb) = (unit_size(a), unit_size(b));
            (sb.saturating_mul(fa))
                .cmp(&sa.saturating_mul(fb))
                .then(fa.cmp(&fb))
                .then(a[0].cmp(&b[0]))
        });
        let mut size = Vec::with_capacity(order.len() + 1);
        let mut saved = Vec::with_capacity(order.len() + 1);
        size.push(0u128);
        saved.push(0u128);
        for u in &order {
            size.push(size.last()? + unit_size(u));
            saved.push(saved.last()?.saturating_add(unit_saved(u)));
        }
        let all_off = (0..items.len())
            .map(|i| Self::off_cost(items, tensors, slot, i))
            .fold(other, u128::saturating_add);
        Some(Ranking {
            slot,
            staging,
            order,
            size,
            saved,
            all_off,
        })
    }

    /// The greedy fill: down the ranking, every tensor that still fits.
    fn greedy(&self, room: u128) -> Choice {
        let n = self.order.len();
        let (mut size, mut saved) = (0u128, 0u128);
        let mut resident = vec![false; n];
        for (pos, slot) in resident.iter_mut().enumerate() {
            let s = self.size[pos + 1] - self.size[pos];
            if size + s <= room {
                size += s;
                saved += self.saved[pos + 1] - self.saved[pos];
                *slot = true;
            }
        }
        Choice {
            time: self.all_off.saturating_sub(saved),
            size,
            resident,
        }
    }

    /// The fastest member of the family "the first `k` of the ranking, then the tensors from
    /// `j >= k` to `e`" whose device bytes fit in `room`.
    fn family(&self, room: u128) -> Option<Choice> {
        let n = self.order.len();
        let mut best: Option<(u128, u128, usize, usize, usize)> = None;
        for k in 0..=n {
            if self.size[k] > room {
                break;
            }
            let left = room - self.size[k];
            for j in k..=n {
                // The last end `e` in j..=n with size[e] - size[j] <= left.
                let limit = self.size[j] + left;
                let e = j + self.size[j..=n].partition_point(|&s| s <= limit) - 1;
                let saved = self.saved[k] + (self.saved[e] - self.saved[j]);
                let time = self.all_off.saturating_sub(saved);
                let size = self.size[k] + (self.size[e] - self.size[j]);
                if best.is_none_or(|b| (time, size) < (b.0, b.1)) {
                    best = Some((time, size, k, j, e));
                }
                if e == n {
                    // A later start only drops tensors from this run.
                    break;
                }
            }
        }
        let (time, size, k, j, e) = best?;
        Some(Choice {
            time,
            size,
            resident: (0..n).map(|pos| pos < k || (j..e).contains(&pos)).collect(),
        })
    }

    /// The faster of the greedy fill and the family's best (the greedy fill on a tie).
    fn best(&self, room: u128) -> Choice {
        let greedy = self.greedy(room);
        match self.family(room) {
            Some(f) if (f.time, f.size) < (greedy.time, greedy.size) => f,
            _ => greedy,
        }
    }
}

/// The planning units: tensors placed together, by index. One MoE layer's expert stacks
/// (gate, up, down) form one unit, since the hybrid split computes a layer's experts on the
/// host only when all three are there; every other tensor is a unit of its own. The units of
/// equal density would otherwise interleave by size across layers.
fn units(tensors: &[WeightTensor]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut by_layer: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    for (i, t) in tensors.iter().enumerate() {
        match (t.kind, t.layer) {
            (TensorKind::Experts { .. }, Some(layer)) => match by_layer.get(&layer) {
                Some(&u) => out[u].push(i),
                None => {
                    by_layer.insert(layer, out.len());
                    out.push(vec![i]);
                }
            },
            _ => out.push(vec![i]),
        }
    }
    out
}

/// A set of resident units (by position in a ranking), its time per token and its device
/// bytes.
struct Choice {
    time: u128,
    size: u128,
    resident: Vec<bool>,
}

/// Plans the placement of every weight under the budget; see the module documentation.
pub fn plan(req: &PlanRequest<'_>) -> Result<Plan, PlanError> {
    let is_lookup = |t: &WeightTensor| matches!(t.kind, TensorKind::Lookup { .. });
    if !req.lookups_on_host || !req.tensors.iter().any(is_lookup) {
        return plan_placements(req);
    }
    req.link.validate()?;
    for t in req.tensors {
        t.check()?;
    }
    // The other tensors are planned as if the tables were not there, then the tables join
    // the plan in their input places, read in place from the host.
    let rest: Vec<WeightTensor> = req
        .tensors
        .iter()
        .filter(|t| !is_lookup(t))
        .cloned()
        .collect();
    let mut inner = plan_placements(&PlanRequest {
        tensors: &rest,
        lookups_on_host: false,
        ..req.clone()
    })?;
    let mut planned = std::mem::take(&mut inner.tensors).into_iter();
    let mut last_rank = planned.as_slice().iter().map(|t| t.rank).max().unwrap_or(0);
    let mut tensors = Vec::with_capacity(req.tensors.len());
    for t in req.tensors {
        if !is_lookup(t) {
            // `rest` holds the other tensors in input order, one planned entry each.
            tensors.extend(planned.next());
            continue;
        }
        let read = t.read_per_token();
        let time_fs = fs(read, req.link.in_place_read());
        inner.link_time_fs = inner.link_time_fs.saturating_add(time_fs);
        last_rank += 1;
        tensors.push(PlannedTensor {
            tensor: t.clone(),
            placement: Placement::HostZeroCopy,
            rank: last_rank,
            device_footprint: device_footprint(t.bytes).ok_or(PlanError::Overflow {
                what: "tensor sizes",
            })?,
            read_per_token: read,
            time_fs,
        });
    }
    inner.tensors = tensors;
    Ok(inner)
}

/// [`plan`] with every tensor a candidate for the device.
fn plan_placements(req: &PlanRequest<'_>) -> Result<Plan, PlanError> {
    req.link.validate()?;
    for t in req.tensors {
        t.check()?;
    }
    let minimum = minimum_budget(&req.needs)?;
    // Every weight on the device: the host staging is not needed.
    let all_on_device_bytes = req
        .tensors
        .iter()
        .try_fold(minimum - req.needs.offload_staging, |acc, t| {
            acc.checked_add(device_footprint(t.bytes)?)
        });
    let all_fit = all_on_device_bytes.is_some_and(|b| req.budget >= b);
    if req.budget < minimum && !all_fit {
        return Err(below_minimum(req.budget, minimum, &req.needs));
    }
    let link = &req.link;
    let items = req
        .tensors
        .iter()
        .map(|t| {
            let read = t.read_per_token();
            let on_device = fs(read, link.device_read);
            Some(Item {
                footprint: device_footprint(t.bytes)?,
                read,
                on_device,
                zero_copy: fs(read, link.in_place_read()),
                streamed: fs(t.bytes, link.copy)
                    .saturating_add(on_device)
                    .saturating_add(STREAM_OVERHEAD_FS),
            })
        })
        .collect::<Option<Vec<Item>>>()
        .ok_or(PlanError::Overflow {
            what: "tensor sizes",
        })?;
    let other = other_time_fs(req.other_device_reads_per_token, link);
    let units = units(req.tensors);
    let mut slots: Vec<u64> = req
        .tensors
        .iter()
        .zip(&items)
        .filter(|(_, it)| it.streams_faster())
        .map(|(t, _)| t.bytes)
        .collect();
    if !req.allow_streamed {
        slots.clear();
    }
    slots.push(0);
    slots.sort_unstable();
    slots.dedup();

    let mut chosen: Option<(Choice, Ranking)> = None;
    for slot in slots {
        let shared = req.needs.offload_staging;
        let Some(ranking) = Ranking::new(&items, req.tensors, &units, slot, other, shared) else {
            continue;
        };
        let fixed = minimum as u128 + ranking.staging as u128;
        let Some(room) = (req.budget as u128).checked_sub(fixed) else {
            continue;
        };
        let mut choice = ranking.best(room);
        choice.size += ranking.staging as u128;
        if chosen
            .as_ref()
            .is_none_or(|(c, _)| (choice.time, choice.size) < (c.time, c.size))
        {
            chosen = Some((choice, ranking));
        }
    }
    // Every weight on the device, without the host staging, when that fits and is not slower
    // (a link model may read some tensor faster in place). The faster of two choices that are
    // each monotone in the budget is monotone.
    let all_time = items
        .iter()
        .map(|it| it.on_device)
        .fold(other, u128::saturating_add);
    let all_on_device = all_fit && chosen.as_ref().is_none_or(|(c, _)| all_time <= c.time);
    let (choice, ranking) = match chosen {
        Some(c) if !all_on_device => c,
        _ => {
            // Ranked as without streaming, for the listing.
            let ranking = Ranking::new(&items, req.tensors, &units, 0, other, 0).ok_or(
                PlanError::Overflow {
                    what: "tensor sizes",
                },
            )?;
            let resident = vec![true; ranking.order.len()];
            (
                Choice {
                    time: all_time,
                    size: 0,
                    resident,
                },
                ranking,
            )
        }
    };

    let n = req.tensors.len();
    let mut on_device = vec![all_on_device; n];
    let mut rank = vec![usize::MAX; n];
    for (pos, unit) in ranking.order.iter().enumerate() {
        for &i in unit {
            rank[i] = pos + 1;
            on_device[i] |= choice.resident[pos];
        }
    }
    let mut next_rank = ranking.order.len();
    let mut tensors = Vec::with_capacity(n);
    let (mut device_time, mut link_time) = (other, 0u128);
    let mut staging_slot = 0u64;
    let mut weights = 0u64;
    let mut weight_slack = 0u64;
    for (i, (t, it)) in req.tensors.iter().zip(&items).enumerate() {
        let placement = if on_device[i] {
            Placement::Device
        } else if ranking.slot > 0 && it.streams_faster() && t.bytes <= ranking.slot {
            Placement::Streamed
        } else {
            Placement::HostZeroCopy
        };
        let time_fs = match placement {
            Placement::Device => {
                device_time = device_time.saturating_add(it.on_device);
                weights = weights.saturating_add(t.bytes);
                // The footprint rounds the size up, so it is never below it.
                weight_slack = weight_slack.saturating_add(it.footprint - t.bytes);
                it.on_device
            }
            Placement::HostZeroCopy => {
                link_time = link_time.saturating_add(it.zero_copy);
                it.zero_copy
            }
            Placement::Streamed => {
                staging_slot = staging_slot.max(t.bytes);
                device_time = device_time.saturating_add(it.on_device);
                link_time = link_time.saturating_add(it.streamed - it.on_device);
                it.streamed
            }
        };
        if rank[i] == usize::MAX {
            next_rank += 1;
            rank[i] = next_rank;
        }
        tensors.push(PlannedTensor {
            tensor: t.clone(),
            placement,
            rank: rank[i],
            device_footprint: it.footprint,
            read_per_token: it.read,
            time_fs,
        });
    }
    let needs = &req.needs;
    // The streaming double buffer and the host staging are the same two slots, as large as
    // the larger need.
    let stream_staging = match staging_slot {
        0 => 0,
        s => 2 * device_footprint(s).unwrap_or(s),
    };
    let mut tags = [0u64; PlanTag::COUNT];
    tags[PlanTag::Weights.index()] = weights;
    tags[PlanTag::KvCache.index()] = needs.kv_cache;
    tags[PlanTag::Activations.index()] = needs.activations;
    tags[PlanTag::Workspace.index()] = needs.workspace;
    tags[PlanTag::Graph.index()] = needs.graph;
    tags[PlanTag::AllocatorSlack.index()] = needs.allocator_slack + weight_slack;
    let host_staging = if all_on_device {
        0
    } else {
        needs.offload_staging
    };
    tags[PlanTag::OffloadStaging.index()] = host_staging.max(stream_staging);
    Ok(Plan {
        budget: req.budget,
        minimum,
        tensors,
        tags,
        staging_slot,
        other_device_reads_per_token: req.other_device_reads_per_token,
        device_time_fs: device_time,
        link_time_fs: link_time,
        link: req.link.clone(),
    })
}

fn below_minimum(budget: u64, minimum: u64, needs: &ResidentNeeds) -> PlanError {
    let parts = [
        ("kv_cache", needs.kv_cache),
        ("activations", needs.activations),
        ("workspace", needs.workspace),
        ("graph", needs.graph),
        ("allocator_slack", needs.allocator_slack),
        ("offload_staging", needs.offload_staging),
    ];
    let breakdown = parts
        .iter()
        .map(|(name, b)| format!("{name} {} MiB", mib(*b)))
        .collect::<Vec<_>>()
        .join(" + ");
    PlanError::BelowMinimum {
        budget,
        minimum,
        budget_mib: budget as f64 / MIB,
        minimum_mib: mib_rounded_up(minimum),
        breakdown,
    }
}
