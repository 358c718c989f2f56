//! The largest block each kernel is launched with, which its `__launch_bounds__` declares.
//!
//! One row per entry point, read from the launchers' own constants in [`crate::ops`], so the
//! number is written once on the host. The kernel sources write it a second time, in
//! `LAUNCH_BOUNDS(…)` (C++ cannot read Rust; `portability.h` makes it `__launch_bounds__` on
//! AMD and nothing on NVIDIA, where it cost the decode products speed); `tests/compile_all.rs` ties the two: it
//! reads `.max_flat_workgroup_size` from every AMD code object and fails where it differs
//! from [`max_block`], and checks that block against the kernel's register count
//! ([`crate::code_object`]).
//!
//! Why declare it at all: without `__launch_bounds__` the compilers budget registers for 1024
//! threads, so a kernel launched with 128 gets a quarter of the registers it could have; and on
//! NVIDIA a kernel whose registers do not fit the block it is launched with fails to launch.

use crate::ops;
use crate::source::KernelModule;

/// A block size: a thread count, or a number of waves (warps) of the device's wave size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxBlock {
    /// This many threads on either wave size.
    Threads(u32),
    /// This many waves: `n * wave_size` threads.
    Waves(u32),
}

impl MaxBlock {
    /// Threads in a block of this size on a device of `wave_size` lanes.
    pub fn threads(self, wave_size: u32) -> u32 {
        match self {
            MaxBlock::Threads(n) => n,
            MaxBlock::Waves(n) => n * wave_size,
        }
    }
}

/// The largest block the op wrappers launch `entry` of `module` with; `None` when `entry` is
/// not one of the module's entry points ([`KernelModule::entry_points`]).
pub fn max_block(module: KernelModule, entry: &str) -> Option<MaxBlock> {
    use MaxBlock::{Threads, Waves};
    if !module.entry_points().contains(&entry) {
        return None;
    }
    Some(match module {
        KernelModule::Embed => Threads(ops::embed::THREADS),
        KernelModule::Norm => match entry {
            "rms_norm_warp" => Threads(ops::norm::WARP_KERNEL_BLOCK),
            _ => Threads(ops::norm::ROWS_MAX_BLOCK),
        },
        KernelModule::Rope => Threads(ops::rope::MAX_BLOCK),
        KernelModule::Elementwise => match entry {
            "gated_q8" => Threads(ops::elementwise::GATED_Q8_THREADS),
            "spin_cycles" => Threads(ops::elementwise::SPIN_THREADS),
            _ => Threads(ops::elementwise::BLOCK),
        },
        KernelModule::KvCache => Threads(ops::kv_cache::BLOCK),
        KernelModule::Attention => match entry {
            "attn_decode_f16" | "attn_decode_f32" | "attn_decode_q8_0" => {
                Waves(ops::attention::DECODE_WARPS)
            }
            "attn_decode_streams_f16" | "attn_decode_streams_q8_0" => {
                Threads(ops::attention::DECODE_STREAM_THREADS)
            }
            "attn_combine" => Threads(ops::attention::COMBINE_THREADS),
            "attn_prefill_f16" | "attn_prefill_f32" | "attn_prefill_q8_0" => {
                Threads(ops::attention::PREFILL_THREADS)
            }
            // attn_{f16,f32,q8_0}.
            _ => Threads(ops::attention::BLOCK),
        },
        KernelModule::AttentionMma => Waves(ops::attention::flash_warps(entry)?),
        KernelModule::Sampling => match entry {
            "sample_logits" => Threads(ops::sampling::SAMPLE_BLOCK),
            "argmax_rows" => Threads(ops::sampling::ARGMAX_ROWS_BLOCK),
            _ => Threads(ops::sampling::ARGMAX_BLOCK),
        },
        KernelModule::Matvec => Threads(ops::matvec::ROW_BLOCK_THREADS),
        KernelModule::MatvecQ8 => {
            if entry == "quantize_q8" {
                Threads(ops::matvec_q8::QUANTIZE_THREADS)
            } else if entry.starts_with("moe_down_q8_") {
                // One wave per routed slot.
                Waves(ops::matvec_q8::MOE_DOWN_MAX_K as u32)
            } else {
                Threads(ops::matvec_q8::BLOCK_THREADS)
            }
        }
        KernelModule::Matmul => Threads(ops::matmul::THREADS),
        KernelModule::MatmulMma => match entry {
            "matmul_mma_reduce" => Threads(ops::matmul_mma::REDUCE_THREADS),
            _ => Waves(ops::matmul_mma::WARPS),
        },
        KernelModule::MatmulQ8Mma => Waves(ops::matmul_q8_mma::WARPS),
        KernelModule::Moe => match entry {
            "moe_weighted_sum" => Threads(ops::moe::SUM_THREADS),
            "moe_group_pairs" => Threads(ops::matmul_q8_mma::GROUP_THREADS),
            // moe_route_top_k and matvec_id_*: warps of a matvec block.
            _ => Threads(ops::matvec::ROW_BLOCK_THREADS),
        },
        KernelModule::Dequant => Threads(ops::dequant::THREADS),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_has_a_block_a_device_can_launch() {
        for module in KernelModule::ALL {
            for &entry in module.entry_points() {
                let block = max_block(module, entry).unwrap_or_else(|| {
                    panic!("{}: {entry} has no launch-bounds row", module.name())
                });
                for wave in [32, 64] {
                    let threads = block.threads(wave);
                    assert!(
                        (1..=1024).contains(&threads),
                        "{entry}: {threads} threads on wave {wave}"
                    );
                }
            }
        }
        assert_eq!(max_block(KernelModule::Norm, "matvec_f32"), None);
        assert_eq!(
            max_block(KernelModule::AttentionMma, "attn_prefill_mma_d256"),
            Some(MaxBlock::Waves(2))
        );
        assert_eq!(MaxBlock::Waves(4).threads(64), 256);
    }

    #[test]
    fn every_kernel_declares_its_launch_bounds() {
        // The compile check compares the declared bounds with this table on AMD; a kernel
        // without a declaration would get the compilers' default of 1024 instead.
        for module in KernelModule::ALL {
            let (file, body) = module.file();
            let mut kernels = 0;
            for (at, _) in body.match_indices("KERNEL ") {
                kernels += 1;
                let declaration = &body[at..at + body[at..].find('(').unwrap_or(0)];
                assert!(
                    declaration.starts_with("KERNEL void LAUNCH_BOUNDS"),
                    "{file}: the kernel at byte {at} declares no launch bounds (write \
                     `KERNEL void LAUNCH_BOUNDS(N) name(` with N its launcher's largest block, \
                     and give it a row in launch_bounds.rs)"
                );
            }
            assert!(kernels > 0, "{file} defines no kernel");
        }
    }
}
