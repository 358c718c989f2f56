//! The table of kernel modules: one HIP C++ file each, compiled as one program.
//!
//! Every program is `portability.h`, then `quant.h` where the module reads quantized weights,
//! then the module's own file, concatenated (no include paths are needed by either run-time
//! compiler). Adding a module means one file under `kernels/` and one row here.
//!
//! ENTRY POINTS (to every engineer with a module here): [`Kernels::load`](crate::Kernels::load)
//! looks up exactly the names [`KernelModule::entry_points`] lists for your module, and
//! `Kernels::function` finds nothing else. Add every `extern "C"` kernel your wrappers launch
//! to your module's arm of `entry_points` (macro-generated names spelled out in full).
//! `tests/compile_all.rs` checks that each listed name is in the compiled code object of every
//! target, so a typo fails there, without a GPU.

/// A kernel module: one source file and the `extern "C"` entry points it defines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelModule {
    /// Embedding rows gathered from (quantized) tables.
    Embed,
    /// RMSNorm, Gemma's variant and per-head Q/K norm.
    Norm,
    /// Rotary position embedding, normal and NeoX.
    Rope,
    /// Gated activations, residual add, bias, scaled row accumulation, copies.
    Elementwise,
    /// Stores of new K/V rows into the cache (f16 or f32, ring slots).
    KvCache,
    /// Decode attention (split over the KV length) and causal prefill attention.
    Attention,
    /// Causal prefill attention on the matrix cores (flash attention over f16 and q8_0 caches),
    /// in two kernels while their A/B is pending.
    AttentionMma,
    /// Argmax and temperature / top-k / top-p sampling into the step block.
    Sampling,
    /// Matrix-vector products over quantized weights.
    Matvec,
    /// Matrix-vector products against 8-bit activations (integer dot products), for decode.
    MatvecQ8,
    /// Matrix-matrix products over quantized weights (prefill).
    Matmul,
    /// Matrix-matrix products over quantized weights on the matrix cores (`mma.h`), for steps
    /// of a few dozen to a few hundred token rows.
    MatmulMma,
    /// Products of quantized weights by 8-bit activations on the matrix cores' integer path
    /// (`mma.h`), for batched decode steps.
    MatmulQ8Mma,
    /// MoE routing, expert dispatch and weighted sum.
    Moe,
    /// Weight rows dequantized to f16 and f32 -> f16 conversion (prefill's vendor-GEMM inputs).
    Dequant,
}

const PORTABILITY_H: &str = include_str!("../kernels/portability.h");
const QUANT_H: &str = include_str!("../kernels/quant.h");
const KV_PAGES_H: &str = include_str!("../kernels/kv_pages.h");
const KV_Q8_H: &str = include_str!("../kernels/kv_q8.h");
const MMA_H: &str = include_str!("../kernels/mma.h");

/// The headers the programs are pasted together from, by file name under `kernels/`.
const HEADERS: [(&str, &str); 5] = [
    ("portability.h", PORTABILITY_H),
    ("quant.h", QUANT_H),
    ("kv_pages.h", KV_PAGES_H),
    ("kv_q8.h", KV_Q8_H),
    ("mma.h", MMA_H),
];

/// Every file the programs are made of, as (file name under `kernels/`, text): the headers,
/// then each module's own file in [`KernelModule::ALL`]'s order. Source checks (the wave-size
/// audit) read this list, so a new module or header is checked without being named again.
pub fn bundled_files() -> Vec<(&'static str, &'static str)> {
    HEADERS
        .into_iter()
        .chain(KernelModule::ALL.into_iter().map(KernelModule::file))
        .collect()
}

impl KernelModule {
    /// Every module, in a fixed order.
    pub const ALL: [KernelModule; 15] = [
        KernelModule::Embed,
        KernelModule::Norm,
        KernelModule::Rope,
        KernelModule::Elementwise,
        KernelModule::KvCache,
        KernelModule::Attention,
        KernelModule::AttentionMma,
        KernelModule::Sampling,
        KernelModule::Matvec,
        KernelModule::MatvecQ8,
        KernelModule::Matmul,
        KernelModule::MatmulMma,
        KernelModule::MatmulQ8Mma,
        KernelModule::Moe,
        KernelModule::Dequant,
    ];

    /// Short name, used for the program name and in messages.
    pub fn name(self) -> &'static str {
        match self {
            KernelModule::Embed => "embed",
            KernelModule::Norm => "norm",
            KernelModule::Rope => "rope",
            KernelModule::Elementwise => "elementwise",
            KernelModule::KvCache => "kv_cache",
            KernelModule::Attention => "attention",
            KernelModule::AttentionMma => "attention_mma",
            KernelModule::Sampling => "sampling",
            KernelModule::Matvec => "matvec",
            KernelModule::MatvecQ8 => "matvec_q8",
            KernelModule::Matmul => "matmul",
            KernelModule::MatmulMma => "matmul_mma",
            KernelModule::MatmulQ8Mma => "matmul_q8_mma",
            KernelModule::Moe => "moe",
            KernelModule::Dequant => "dequant",
        }
    }

    /// The module's own file: its name under `kernels/` and its text.
    pub fn file(self) -> (&'static str, &'static str) {
        macro_rules! kernel_file {
            ($name:literal) => {
                ($name, include_str!(concat!("../kernels/", $name)))
            };
        }
        match self {
            KernelModule::Embed => kernel_file!("embed.hip"),
            KernelModule::Norm => kernel_file!("norm.hip"),
            KernelModule::Rope => kernel_file!("rope.hip"),
            KernelModule::Elementwise => kernel_file!("elementwise.hip"),
            KernelModule::KvCache => kernel_file!("kv_cache.hip"),
            KernelModule::Attention => kernel_file!("attention.hip"),
            KernelModule::AttentionMma => kernel_file!("attention_mma.hip"),
            KernelModule::Sampling => kernel_file!("sampling.hip"),
            KernelModule::Matvec => kernel_file!("matvec.hip"),
            KernelModule::MatvecQ8 => kernel_file!("matvec_q8.hip"),
            KernelModule::Matmul => kernel_file!("matmul.hip"),
            KernelModule::MatmulMma => kernel_file!("matmul_mma.hip"),
            KernelModule::MatmulQ8Mma => kernel_file!("matmul_q8_mma.hip"),
            KernelModule::Moe => kernel_file!("moe.hip"),
            KernelModule::Dequant => kernel_file!("dequant.hip"),
        }
    }

    fn body(self) -> &'static str {
        self.file().1
    }

    /// The `extern "C"` kernels of the module that [`crate::Kernels`] looks up at load time.
    /// Each module's owner keeps its arm in step with its source file (see the module docs).
    pub fn entry_points(self) -> &'static [&'static str] {
        match self {
            KernelModule::Norm => &["rms_norm_rows", "rms_norm_warp", "add_rms_norm_q8"],
            KernelModule::Elementwise => &[
                "gated_silu",
                "gated_gelu_tanh",
                "add_inplace",
                "add_bias_rows",
                "add_scaled",
                "scale_inplace",
                "softcap_inplace",
                "copy_f32",
                "zero_f32",
                "spin_cycles",
                "gated_q8",
            ],
            KernelModule::Sampling => &[
                "argmax_partial",
                "argmax_final",
                "argmax_rows",
                "sample_logits",
            ],
            // Owners of these modules: list your entry points here.
            KernelModule::Embed => &[
                "embed_f32",
                "embed_f16",
                "embed_bf16",
                "embed_q4_0",
                "embed_q4_1",
                "embed_q5_0",
                "embed_q5_1",
                "embed_q8_0",
                "embed_q4_k",
                "embed_q5_k",
                "embed_q6_k",
                "embed_q2_k",
                "embed_q3_k",
                "embed_iq4_nl",
                "embed_iq4_xs",
            ],
            KernelModule::Rope => &["rope_f32", "rope_store_f16", "rope_store_f32"],
            KernelModule::KvCache => &["kv_store_f16", "kv_store_f32", "kv_store_q8_0"],
            KernelModule::Attention => &[
                "attn_f16",
                "attn_f32",
                "attn_combine",
                "attn_decode_f16",
                "attn_decode_streams_f16",
                "attn_decode_f32",
                "attn_prefill_f16",
                "attn_prefill_f32",
                "attn_q8_0",
                "attn_decode_q8_0",
                "attn_decode_streams_q8_0",
                "attn_prefill_q8_0",
            ],
            KernelModule::AttentionMma => &[
                "attn_prefill_mma_d64",
                "attn_prefill_mma_d128",
                "attn_prefill_mma_d256",
                "attn_prefill_mma_q8_0_d64",
                "attn_prefill_mma_q8_0_d128",
                "attn_prefill_mma_q8_0_d256",
                "attn_prefill_mma_regs_d64",
                "attn_prefill_mma_regs_d128",
                "attn_prefill_mma_regs_d256",
                "attn_prefill_mma_regs_q8_0_d64",
                "attn_prefill_mma_regs_q8_0_d128",
                "attn_prefill_mma_regs_q8_0_d256",
            ],
            KernelModule::Matvec => &[
                "matvec_f32",
                "matvec_f16",
                "matvec_bf16",
                "matvec_q4_0",
                "matvec_q4_1",
                "matvec_q5_0",
                "matvec_q5_1",
                "matvec_q8_0",
                "matvec_q4_k",
                "matvec_q5_k",
                "matvec_q6_k",
                "matvec_q2_k",
                "matvec_q3_k",
                "matvec_iq4_nl",
                "matvec_iq4_xs",
            ],
            // quantize_q8, then per format of Q8_FORMATS (ops::matvec_q8) the entry for up to
            // eight tokens and the one for a single token.
            KernelModule::MatvecQ8 => &[
                "quantize_q8",
                "matvec_q8_q4_0",
                "matvec_q8_one_q4_0",
                "matvec_q8_q4_1",
                "matvec_q8_one_q4_1",
                "matvec_q8_q5_0",
                "matvec_q8_one_q5_0",
                "matvec_q8_q5_1",
                "matvec_q8_one_q5_1",
                "matvec_q8_q8_0",
                "matvec_q8_one_q8_0",
                "matvec_q8_q4_k",
                "matvec_q8_one_q4_k",
                "matvec_q8_q5_k",
                "matvec_q8_one_q5_k",
                "matvec_q8_q6_k",
                "matvec_q8_one_q6_k",
                "matvec_q8_q2_k",
                "matvec_q8_one_q2_k",
                "matvec_q8_q3_k",
                "matvec_q8_one_q3_k",
                "matvec_q8_iq4_nl",
                "matvec_q8_one_iq4_nl",
                "matvec_q8_iq4_xs",
                "matvec_q8_one_iq4_xs",
                "matvec_id_q8_q4_0",
                "matvec_id_q8_q4_1",
                "matvec_id_q8_q5_0",
                "matvec_id_q8_q5_1",
                "matvec_id_q8_q8_0",
                "matvec_id_q8_q4_k",
                "matvec_id_q8_q5_k",
                "matvec_id_q8_q6_k",
                "matvec_id_q8_q2_k",
                "matvec_id_q8_q3_k",
                "matvec_id_q8_iq4_nl",
                "matvec_id_q8_iq4_xs",
                "moe_down_q8_q4_0",
                "moe_down_q8_q4_1",
                "moe_down_q8_q5_0",
                "moe_down_q8_q5_1",
                "moe_down_q8_q8_0",
                "moe_down_q8_q4_k",
                "moe_down_q8_q5_k",
                "moe_down_q8_q6_k",
                "moe_down_q8_q2_k",
                "moe_down_q8_q3_k",
                "moe_down_q8_iq4_nl",
                "moe_down_q8_iq4_xs",
            ],
            KernelModule::Matmul => &[
                "matmul_f32",
                "matmul_f16",
                "matmul_bf16",
                "matmul_q4_0",
                "matmul_q4_1",
                "matmul_q5_0",
                "matmul_q5_1",
                "matmul_q8_0",
                "matmul_q4_k",
                "matmul_q5_k",
                "matmul_q6_k",
                "matmul_q2_k",
                "matmul_q3_k",
                "matmul_iq4_nl",
                "matmul_iq4_xs",
            ],
            KernelModule::MatmulMma => &[
                "matmul_mma_f32",
                "matmul_mma_f16",
                "matmul_mma_bf16",
                "matmul_mma_q4_0",
                "matmul_mma_q4_1",
                "matmul_mma_q5_0",
                "matmul_mma_q5_1",
                "matmul_mma_q8_0",
                "matmul_mma_q4_k",
                "matmul_mma_q5_k",
                "matmul_mma_q6_k",
                "matmul_mma_q2_k",
                "matmul_mma_q3_k",
                "matmul_mma_iq4_nl",
                "matmul_mma_iq4_xs",
                "matmul_mma_reduce",
            ],
            // Per format of ops::matmul_q8_mma::FORMATS, then the grouped (MoE) ones, then
            // the small-tile ones, each in the same order.
            KernelModule::MatmulQ8Mma => &[
                "matmul_q8_mma_q4_0",
                "matmul_q8_mma_q4_1",
                "matmul_q8_mma_q8_0",
                "matmul_q8_mma_q4_k",
                "matmul_q8_mma_q5_k",
                "matmul_q8_mma_q6_k",
                "matmul_q8_mma_grouped_q4_0",
                "matmul_q8_mma_grouped_q4_1",
                "matmul_q8_mma_grouped_q8_0",
                "matmul_q8_mma_grouped_q4_k",
                "matmul_q8_mma_grouped_q5_k",
                "matmul_q8_mma_grouped_q6_k",
                "matmul_q8_mma_small_q4_0",
                "matmul_q8_mma_small_q4_1",
                "matmul_q8_mma_small_q8_0",
                "matmul_q8_mma_small_q4_k",
                "matmul_q8_mma_small_q5_k",
                "matmul_q8_mma_small_q6_k",
            ],
            KernelModule::Moe => &[
                "moe_route_top_k",
                "moe_weighted_sum",
                "matvec_id_f32",
                "matvec_id_f16",
                "matvec_id_bf16",
                "matvec_id_q4_0",
                "matvec_id_q4_1",
                "matvec_id_q5_0",
                "matvec_id_q5_1",
                "matvec_id_q8_0",
                "matvec_id_q4_k",
                "matvec_id_q5_k",
                "matvec_id_q6_k",
                "matvec_id_q2_k",
                "matvec_id_q3_k",
                "matvec_id_iq4_nl",
                "matvec_id_iq4_xs",
                // After the per-format entries, whose places `format_entry` counts.
                "moe_group_pairs",
            ],
            // Per format of WEIGHT_FORMATS (ops::dequant), then the plain conversion.
            KernelModule::Dequant => &[
                "dequant_f16_f32",
                "dequant_f16_f16",
                "dequant_f16_bf16",
                "dequant_f16_q4_0",
                "dequant_f16_q4_1",
                "dequant_f16_q5_0",
                "dequant_f16_q5_1",
                "dequant_f16_q8_0",
                "dequant_f16_q4_k",
                "dequant_f16_q5_k",
                "dequant_f16_q6_k",
                "dequant_f16_q2_k",
                "dequant_f16_q3_k",
                "dequant_f16_iq4_nl",
                "dequant_f16_iq4_xs",
                "convert_f32_to_f16",
            ],
        }
    }

    /// Whether the module reads or writes K/V caches (and so needs `kv_pages.h` and the q8_0
    /// cache format, `kv_q8.h`).
    fn touches_kv_cache(self) -> bool {
        matches!(
            self,
            KernelModule::KvCache
                | KernelModule::Rope
                | KernelModule::Attention
                | KernelModule::AttentionMma
        )
    }

    /// Whether the module reads quantized weight blocks (and so needs `quant.h`).
    fn reads_quantized(self) -> bool {
        matches!(
            self,
            KernelModule::Embed
                | KernelModule::Matvec
                | KernelModule::MatvecQ8
                | KernelModule::Matmul
                | KernelModule::MatmulMma
                | KernelModule::MatmulQ8Mma
                | KernelModule::Moe
                | KernelModule::Dequant
        )
    }

    /// Whether the module multiplies on the matrix cores (and so needs `mma.h`, and the host's
    /// `-DMMA_VARIANT`).
    pub fn uses_matrix_cores(self) -> bool {
        matches!(
            self,
            KernelModule::MatmulMma | KernelModule::MatmulQ8Mma | KernelModule::AttentionMma
        )
    }

    /// The whole program handed to the compiler. `#include "…"` lines of the bundled headers
    /// are dropped, since the headers are pasted in front, and so are the headers' `#pragma
    /// once` lines (in one pasted program they only draw a warning).
    pub fn source(self) -> String {
        let mut text = String::with_capacity(32 * 1024);
        let mut parts = vec![PORTABILITY_H];
        if self.reads_quantized() {
            parts.push(QUANT_H);
        }
        if self.touches_kv_cache() {
            parts.push(KV_PAGES_H);
            parts.push(KV_Q8_H);
        }
        if self.uses_matrix_cores() {
            parts.push(MMA_H);
        }
        parts.push(self.body());
        for part in parts {
            for line in part.lines() {
                let trimmed = line.trim();
                if trimmed.starts_with("#include \"portability.h\"")
                    || trimmed.starts_with("#include \"quant.h\"")
                    || trimmed.starts_with("#include \"kv_pages.h\"")
                    || trimmed.starts_with("#include \"kv_q8.h\"")
                    || trimmed.starts_with("#include \"mma.h\"")
                    || trimmed == "#pragma once"
                {
                    continue;
                }
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_starts_with_the_portability_header_and_has_no_local_includes() {
        let header_start = PORTABILITY_H
            .lines()
            .take_while(|l| l.trim() != "#pragma once")
            .collect::<Vec<_>>()
            .join("\n");
        let quant_marker = QUANT_H.lines().find(|l| l.contains("DEVICE")).unwrap_or("");
        for module in KernelModule::ALL {
            let source = module.source();
            assert!(source.starts_with(&header_start), "{}", module.name());
            assert!(
                !source.contains("#include \""),
                "{} keeps an include",
                module.name()
            );
            assert!(!source.contains("#pragma once"), "{}", module.name());
            if !quant_marker.is_empty() {
                assert_eq!(source.contains(quant_marker), module.reads_quantized());
            }
        }
    }

    #[test]
    fn every_kernel_begins_with_the_prologue() {
        // The host launches every entry point with programmatic dependent launch where the
        // device has it, which is sound only if each kernel waits for the grid ahead first.
        for module in KernelModule::ALL {
            let body = module.body();
            let mut kernels = 0;
            // Every declaration, whatever follows the macro (`KERNEL void __launch_bounds__(…)`).
            for (at, _) in body.match_indices("KERNEL ") {
                kernels += 1;
                let open = at + body[at..].find('{').expect("a kernel has a body");
                let first = body[open + 1..]
                    .trim_start_matches(|c: char| c.is_whitespace() || c == '\\')
                    .split(';')
                    .next()
                    .unwrap_or("");
                assert_eq!(
                    first,
                    "KERNEL_PROLOGUE()",
                    "{}: the kernel at byte {at} does not begin with KERNEL_PROLOGUE",
                    module.name()
                );
            }
            assert!(kernels > 0, "{} defines no kernel", module.name());
        }
    }

    #[test]
    fn listed_entry_points_are_unique_and_named_in_the_source() {
        for module in KernelModule::ALL {
            let source = module.source();
            let names = module.entry_points();
            for (i, name) in names.iter().enumerate() {
                assert!(!names[..i].contains(name), "{name} listed twice");
                // Macro-generated names are spelled whole only after expansion: `<op>##param`
                // in an entry macro, instantiated with `(<rest>, …)` (directly, or through
                // quant.h's FOR_EACH_WEIGHT_FORMAT).
                let generated = (1..name.len()).any(|at| {
                    let (op, rest) = name.split_at(at);
                    source.contains(&format!("{op}##")) && source.contains(&format!("({rest},"))
                });
                assert!(
                    source.contains(name) || generated,
                    "{}: entry point {name} is not in the source",
                    module.name()
                );
            }
        }
    }
}
