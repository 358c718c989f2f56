//! The KV pool a run can afford: from a budget in bytes (`--kv-budget`, `HIPDECODE_KV_BUDGET`),
//! or, without one, from the device memory the run has left once its weights are loaded.
//!
//! The second is a server's default on a GPU: asking for every sequence's whole context
//! (`--parallel` x `--ctx` positions) would fail with an out-of-memory error at start on a card
//! that cannot hold it, where a smaller pool only makes requests wait for blocks. The pool is
//! the largest whose layout (the KV cache with the activations, workspace, allocator slack
//! and runtime memory that [`ModelLayout`] lists for the same bounds) fits what is left, less a
//! reserve for the rest of the machine.

use crate::error::{DecodeError, Result};
use crate::gguf_loader::GgufFile;
use crate::layout::{LayoutOptions, ModelLayout};
use crate::memory::human_bytes;
pub use crate::memory::DeviceRoom;
use offload::PlanTag;

pub static KV_BUDGET: knobs::Knob<Option<u64>> = knobs::Knob {
    name: "HIPDECODE_KV_BUDGET",
    default: "",
    doc: "bytes of KV cache a server's sequences share when --kv-budget is not given (\"2GiB\"; \
          unset: on a GPU what the device has left after the weights, activations and \
          workspace, less a reserve, at most every sequence's whole context; on the CPU every \
          sequence's whole context)",
    scope: knobs::Scope::Run,
    parse: |v| offload::budget::parse_optional_size(KV_BUDGET.name, v),
};

/// The pool that fits, and the figures it came from (for the line a server prints).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvFit {
    /// Blocks of the pool; `None` when every sequence's whole context fits.
    pub blocks: Option<usize>,
    /// Blocks of every sequence's whole context.
    pub whole_blocks: usize,
    /// Bytes of the KV cache at `blocks` (the sliding-window layers' rows included).
    pub kv_bytes: u64,
    /// Device bytes of the rest of the layout at `blocks`: activations, workspace, allocator
    /// slack, runtime memory outside the allocator.
    pub other_bytes: u64,
    /// The room it was fitted to.
    pub room: DeviceRoom,
}

impl KvFit {
    /// One line: the pool, and what it was fitted to.
    pub fn describe(&self) -> String {
        let limit = match self.room.allocator_headroom {
            Some(h) => format!(
                ", {} left under the allocator's memory limit",
                human_bytes(h)
            ),
            None => String::new(),
        };
        let pool = match self.blocks {
            None => "every sequence's whole context fits".to_string(),
            Some(b) => format!(
                "{b} of the {} blocks of every whole context fit",
                self.whole_blocks
            ),
        };
        format!(
            "KV budget {}: {pool} in the {} free on the device after the weights{limit}, with \
             {} for the activations, workspace and runtime, and a reserve of {}",
            human_bytes(self.kv_bytes),
            human_bytes(self.room.free),
            human_bytes(self.other_bytes),
            human_bytes(self.room.reserve())
        )
    }
}

/// The device bytes of `layout` (every weight already loaded, so none of the weights' own):
/// under the allocator (KV, activations, workspace, slack, and the offload staging where
/// weights stay on the host) and outside it (graphs, runtime pages).
fn needs(layout: &ModelLayout, host_weights: bool) -> (u64, u64) {
    let n = &layout.needs;
    let staging = if host_weights { n.offload_staging } else { 0 };
    let allocator = [
        n.kv_cache,
        n.activations,
        n.workspace,
        n.allocator_slack,
        staging,
    ]
    .iter()
    .fold(0u64, |a, &b| a.saturating_add(b));
    (allocator, layout.tag_bytes(PlanTag::Graph))
}

/// The largest KV pool for `options`'s bounds (its `kv_blocks` is ignored) whose layout fits
/// `room` less its reserve, with the weights already loaded (the prefill's staging slots count
/// where some stay in host memory). An error names the figures and the fixes when not even one
/// block fits.
pub fn kv_blocks_that_fit(
    file: &GgufFile,
    options: &LayoutOptions,
    room: &DeviceRoom,
) -> Result<KvFit> {
    let host_weights = room.host_weights;
    let layout_at = |blocks: Option<usize>| {
        let mut o = *options;
        o.bounds.kv_blocks = blocks;
        ModelLayout::new(file, &o)
    };
    let fits = |layout: &ModelLayout| {
        let (allocator, outside) = needs(layout, host_weights);
        let under_limit = room.allocator_headroom.is_none_or(|h| allocator <= h);
        let device = allocator
            .saturating_add(outside)
            .saturating_add(room.reserve());
        under_limit && device <= room.free
    };
    let fit = |layout: &ModelLayout, blocks, whole_blocks| {
        let (allocator, outside) = needs(layout, host_weights);
        let kv_bytes = layout.needs.kv_cache;
        KvFit {
            blocks,
            whole_blocks,
            kv_bytes,
            other_bytes: (allocator - kv_bytes).saturating_add(outside),
            room: *room,
        }
    };
    let whole = layout_at(None)?;
    let s = &whole.spec;
    let whole_blocks = super::context::kv_plan(
        s,
        whole.context,
        options.bounds.max_batch,
        options.bounds.sequences,
        crate::kv::block_positions(),
        None,
    )?
    .pool_blocks;
    if fits(&whole) {
        return Ok(fit(&whole, None, whole_blocks));
    }
    let one = layout_at(Some(1))?;
    if !fits(&one) {
        let (allocator, outside) = needs(&one, host_weights);
        let under = match room.allocator_headroom {
            Some(h) => format!(" ({} under the allocator's memory limit)", human_bytes(h)),
            None => String::new(),
        };
        return Err(DecodeError::InvalidArgument(format!(
            "one KV block of {} positions with the activations and workspace needs {} of device \
             memory and a reserve of {}, but {} is free after the weights{under}; lower \
             --parallel or --batch, raise --gpu-budget so fewer weights stay on the host (or \
             give one so that some do), or free device memory",
            crate::kv::block_positions(),
            human_bytes(allocator.saturating_add(outside)),
            human_bytes(room.reserve()),
            human_bytes(room.free)
        )));
    }
    // The layout grows with the blocks, so the largest that fits is a binary search:
    // `lo` fits, `hi` does not.
    let (mut lo, mut hi, mut best) = (1usize, whole_blocks, one);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let layout = layout_at(Some(mid))?;
        if fits(&layout) {
            (lo, best) = (mid, layout);
        } else {
            hi = mid;
        }
    }
    Ok(fit(&best, Some(lo), whole_blocks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::ContextOptions;
    use gguf_loader::synth::Preset;

    fn file() -> GgufFile {
        let bytes = gguf_loader::synth::preset_bytes(Preset::TinyLlama, 11).unwrap();
        GgufFile::from_bytes(bytes).unwrap()
    }

    fn options() -> LayoutOptions {
        LayoutOptions {
            bounds: ContextOptions {
                context: 2048,
                sequences: 8,
                max_batch: 64,
                ..ContextOptions::default()
            },
            ..LayoutOptions::default()
        }
    }

    fn room(free: u64, headroom: Option<u64>) -> DeviceRoom {
        DeviceRoom {
            free,
            allocator_headroom: headroom,
            total: 1 << 30,
            host_weights: false,
        }
    }

    /// Device bytes of the layout at `blocks` (`None`: whole contexts), and of its allocator
    /// part.
    fn need(f: &GgufFile, o: &LayoutOptions, blocks: Option<usize>) -> (u64, u64) {
        let mut o = *o;
        o.bounds.kv_blocks = blocks;
        let (allocator, outside) = needs(&ModelLayout::new(f, &o).unwrap(), false);
        (allocator + outside, allocator)
    }

    #[test]
    fn the_pool_is_the_largest_that_fits_and_grows_with_the_room() {
        let (f, o) = (file(), options());
        let reserve = room(0, None).reserve();
        let (whole, _) = need(&f, &o, None);
        let (one, _) = need(&f, &o, Some(1));
        assert!(
            whole > one + (1 << 20),
            "the test needs a KV cache that matters"
        );
        let fit = kv_blocks_that_fit(&f, &o, &room(whole + reserve, None)).unwrap();
        assert_eq!(fit.blocks, None, "room for every whole context");
        assert_eq!(fit.kv_bytes + fit.other_bytes, whole);
        assert!(
            fit.describe().contains("whole context fits"),
            "{}",
            fit.describe()
        );
        let mut last = usize::MAX;
        for free in [whole - 1, (whole + one) / 2, one + (whole - one) / 8, one] {
            let fit = kv_blocks_that_fit(&f, &o, &room(free + reserve, None)).unwrap();
            let blocks = fit.blocks.expect("less than every whole context");
            assert!(blocks < fit.whole_blocks, "{fit:?}");
            assert_eq!(need(&f, &o, Some(blocks)).0, fit.kv_bytes + fit.other_bytes);
            assert!(fit.kv_bytes + fit.other_bytes <= free, "{fit:?}");
            assert!(
                need(&f, &o, Some(blocks + 1)).0 > free,
                "{blocks} + 1 blocks fit {free}"
            );
            assert!(blocks <= last, "less room, no more blocks");
            last = blocks;
        }
        // The allocator's rounding makes the layout grow in steps: the room of one block holds
        // as many as round the same way.
        assert_eq!(need(&f, &o, Some(last)).0, one, "the smallest room");
        let err = kv_blocks_that_fit(&f, &o, &room(one + reserve - 1, None))
            .unwrap_err()
            .to_string();
        for part in [
            "one KV block",
            "--parallel",
            "--gpu-budget",
            "free after the weights",
        ] {
            assert!(err.contains(part), "{part}: {err}");
        }
    }

    #[test]
    fn a_gpu_budget_bounds_the_pool() {
        let (f, o) = (file(), options());
        let free = u64::MAX / 4;
        let (_, whole) = need(&f, &o, None);
        let (_, one) = need(&f, &o, Some(1));
        let limit = (whole + one) / 2;
        let fit = kv_blocks_that_fit(&f, &o, &room(free, Some(limit))).unwrap();
        let blocks = fit.blocks.expect("half way: fewer blocks");
        assert!(need(&f, &o, Some(blocks)).1 <= limit && need(&f, &o, Some(blocks + 1)).1 > limit);
        assert!(
            fit.describe()
                .contains("left under the allocator's memory limit"),
            "{}",
            fit.describe()
        );
        let err = kv_blocks_that_fit(&f, &o, &room(free, Some(one - 1))).unwrap_err();
        assert!(
            err.to_string()
                .contains("under the allocator's memory limit"),
            "{err}"
        );
    }

    #[test]
    fn the_knob_reads_sizes_and_names_itself_on_a_bad_one() {
        let env = |v: &str| knobs::Env::from_pairs([(KV_BUDGET.name, v)]);
        assert_eq!(KV_BUDGET.value(&env("2GiB")).unwrap(), Some(2 << 30));
        assert_eq!(KV_BUDGET.value(&env("")).unwrap(), None);
        let e = KV_BUDGET.value(&env("lots")).unwrap_err().to_string();
        assert!(
            e.contains("HIPDECODE_KV_BUDGET") && e.contains("lots"),
            "{e}"
        );
    }
}
