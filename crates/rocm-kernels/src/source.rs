//! The table of kernel modules: one HIP C++ file each, compiled as one program.
//!
//! Every program is `portability.h`, then `quant.h` where the module reads quantized weights,
//! then the module's own file, concatenated (no include paths are needed by either run-time
//! compiler). Adding a module means one file under `kernels/` and one row here.

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
    /// Argmax and temperature / top-k / top-p sampling into the step block.
    Sampling,
    /// Matrix-vector products over quantized weights.
    Matvec,
    /// Matrix-matrix products over quantized weights (prefill).
    Matmul,
    /// MoE routing, expert dispatch and weighted sum.
    Moe,
}

const PORTABILITY_H: &str = include_str!("../kernels/portability.h");
const QUANT_H: &str = include_str!("../kernels/quant.h");

impl KernelModule {
    /// Every module, in a fixed order.
    pub const ALL: [KernelModule; 10] = [
        KernelModule::Embed,
        KernelModule::Norm,
        KernelModule::Rope,
        KernelModule::Elementwise,
        KernelModule::KvCache,
        KernelModule::Attention,
        KernelModule::Sampling,
        KernelModule::Matvec,
        KernelModule::Matmul,
        KernelModule::Moe,
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
            KernelModule::Sampling => "sampling",
            KernelModule::Matvec => "matvec",
            KernelModule::Matmul => "matmul",
            KernelModule::Moe => "moe",
        }
    }

    fn body(self) -> &'static str {
        match self {
            KernelModule::Embed => include_str!("../kernels/embed.hip"),
            KernelModule::Norm => include_str!("../kernels/norm.hip"),
            KernelModule::Rope => include_str!("../kernels/rope.hip"),
            KernelModule::Elementwise => include_str!("../kernels/elementwise.hip"),
            KernelModule::KvCache => include_str!("../kernels/kv_cache.hip"),
            KernelModule::Attention => include_str!("../kernels/attention.hip"),
            KernelModule::Sampling => include_str!("../kernels/sampling.hip"),
            KernelModule::Matvec => include_str!("../kernels/matvec.hip"),
            KernelModule::Matmul => include_str!("../kernels/matmul.hip"),
            KernelModule::Moe => include_str!("../kernels/moe.hip"),
        }
    }

    /// Whether the module reads quantized weight blocks (and so needs `quant.h`).
    fn reads_quantized(self) -> bool {
        matches!(
            self,
            KernelModule::Embed | KernelModule::Matvec | KernelModule::Matmul | KernelModule::Moe
        )
    }

    /// The whole program handed to the compiler. `#include "…"` lines of the bundled headers
    /// are dropped, since the headers are pasted in front.
    pub fn source(self) -> String {
        let mut text = String::with_capacity(32 * 1024);
        text.push_str(PORTABILITY_H);
        text.push('\n');
        if self.reads_quantized() {
            text.push_str(QUANT_H);
            text.push('\n');
        }
        for line in self.body().lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("#include \"portability.h\"")
                || trimmed.starts_with("#include \"quant.h\"")
            {
                continue;
            }
            text.push_str(line);
            text.push('\n');
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_starts_with_the_portability_header_and_has_no_local_includes() {
        for module in KernelModule::ALL {
            let source = module.source();
            assert!(source.starts_with(PORTABILITY_H), "{}", module.name());
            assert!(!source.contains("#include \""), "{} keeps an include", module.name());
            assert_eq!(source.contains(QUANT_H), module.reads_quantized() && !QUANT_H.is_empty());
        }
    }
}
