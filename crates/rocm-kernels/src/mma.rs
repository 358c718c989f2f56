//! Which implementation of the matrix-core layer (`kernels/mma.h`) a device gets.
//!
//! The kernels that multiply on the matrix cores are written once against `mma.h`'s fragment
//! API; the host picks the variant from the device's architecture and [`MMA`]'s setting and
//! compiles with `-DMMA_VARIANT=<id>`. The header refuses (a compile error) a variant whose
//! instructions the target lacks, so a wrong pick here cannot give wrong numbers.
//!
//! By default a device gets its native variant only where it has also run: NVIDIA sm_80 and
//! later (tested on the H200 against the SIMT build and the CPU reference). AMD's variants
//! have never run on an AMD GPU: CDNA's MFMA compiles in CI (hiprtc, gfx90a, whose builtin
//! gfx908 and gfx94x share), RDNA 3 and 4's WMMA nowhere here. Until a run on the device checks
//! them (the self-test of the AMD readiness issue), AMD parts take the SIMT variant unless
//! `HIPDECODE_MMA=native`, and the kernels that only pay on matrix cores (flash prefill) keep
//! their previous paths there.

use hip_ffi::PlatformKind;
use knobs::{Knob, Scope};

/// An implementation of `mma.h`; the discriminant is its `MMA_VARIANT` id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaVariant {
    /// Each lane sums its share of the tile from shared memory: any target.
    Simt = 0,
    /// NVIDIA `mma.sync.m16n8k16` (compute capability 8.0 and later).
    NvidiaMmaSync = 1,
    /// AMD CDNA `v_mfma_f32_16x16x16f16` (gfx908, gfx90a, gfx94x, gfx950; wave64).
    AmdMfma = 2,
    /// AMD RDNA 3 `v_wmma_f32_16x16x16_f16` (gfx11; wave32).
    AmdWmmaGfx11 = 3,
    /// AMD RDNA 4's form of the same instruction (gfx12; wave32).
    AmdWmmaGfx12 = 4,
}

/// What [`MMA`] asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaSetting {
    /// The native variant where it has run (NVIDIA), SIMT elsewhere.
    Auto,
    /// The native variant on every part that has one, AMD's included.
    Native,
    /// The SIMT variant everywhere (the reference build the native ones are tested against).
    Simt,
}

pub static MMA: Knob<MmaSetting> = Knob {
    name: "HIPDECODE_MMA",
    default: "auto",
    doc: "matrix-core kernels: `auto` (native on NVIDIA sm_80+, the SIMT build elsewhere), \
          `native` (also AMD's MFMA and WMMA, which have not run on an AMD GPU yet) or `simt`",
    scope: Scope::Run,
    parse: |v| {
        knobs::parse::choice(
            v,
            &[
                ("auto", MmaSetting::Auto),
                ("native", MmaSetting::Native),
                ("simt", MmaSetting::Simt),
            ],
        )
    },
};

impl MmaVariant {
    /// The variant a device of `platform` and architecture `arch` (`sm_90`, `gfx90a:xnack-`,
    /// ...; `None` when the runtime names none) gets under `setting`.
    pub fn choose(platform: PlatformKind, arch: Option<&str>, setting: MmaSetting) -> MmaVariant {
        let native = arch.map_or(MmaVariant::Simt, |a| native_variant(platform, a));
        match (setting, native) {
            (MmaSetting::Simt, _) => MmaVariant::Simt,
            (
                MmaSetting::Auto,
                MmaVariant::AmdMfma | MmaVariant::AmdWmmaGfx11 | MmaVariant::AmdWmmaGfx12,
            ) => MmaVariant::Simt,
            (_, native) => native,
        }
    }

    /// The compile option that selects this variant in `mma.h`.
    pub fn compile_option(self) -> String {
        format!("-DMMA_VARIANT={}", self as u32)
    }

    /// Whether the variant runs on matrix cores (everything but [`MmaVariant::Simt`]).
    pub fn is_native(self) -> bool {
        self != MmaVariant::Simt
    }

    /// A short name without spaces, for reports.
    pub fn name(self) -> &'static str {
        match self {
            MmaVariant::Simt => "simt",
            MmaVariant::NvidiaMmaSync => "nvidia-mma-sync",
            MmaVariant::AmdMfma => "amd-mfma",
            MmaVariant::AmdWmmaGfx11 => "amd-wmma-gfx11",
            MmaVariant::AmdWmmaGfx12 => "amd-wmma-gfx12",
        }
    }
}

/// The matrix-core variant of an architecture, or SIMT where it has none.
fn native_variant(platform: PlatformKind, arch: &str) -> MmaVariant {
    // AMD names carry target features after a colon ("gfx90a:sramecc+:xnack-").
    let base = arch.split(':').next().unwrap_or(arch);
    match platform {
        PlatformKind::Nvidia => {
            let capability: Option<u32> = base
                .strip_prefix("sm_")
                .or_else(|| base.strip_prefix("compute_"))
                .and_then(|c| {
                    c.trim_end_matches(|ch: char| ch.is_ascii_alphabetic())
                        .parse()
                        .ok()
                });
            match capability {
                Some(cc) if cc >= 80 => MmaVariant::NvidiaMmaSync,
                _ => MmaVariant::Simt,
            }
        }
        PlatformKind::Amd => match base {
            "gfx908" | "gfx90a" | "gfx940" | "gfx941" | "gfx942" | "gfx950" => MmaVariant::AmdMfma,
            "gfx1100" | "gfx1101" | "gfx1102" | "gfx1103" | "gfx1150" | "gfx1151" | "gfx1152" => {
                MmaVariant::AmdWmmaGfx11
            }
            "gfx1200" | "gfx1201" => MmaVariant::AmdWmmaGfx12,
            _ => MmaVariant::Simt,
        },
        PlatformKind::None => MmaVariant::Simt,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_architecture_gets_its_family_and_wmma_waits_for_native() {
        use MmaSetting::*;
        let pick = |p, a: &str, s| MmaVariant::choose(p, Some(a), s);
        let (amd, nv) = (PlatformKind::Amd, PlatformKind::Nvidia);
        assert_eq!(pick(nv, "sm_90", Auto), MmaVariant::NvidiaMmaSync);
        assert_eq!(pick(nv, "sm_90a", Auto), MmaVariant::NvidiaMmaSync);
        assert_eq!(pick(nv, "sm_80", Auto), MmaVariant::NvidiaMmaSync);
        assert_eq!(pick(nv, "sm_75", Native), MmaVariant::Simt);
        assert_eq!(pick(nv, "sm_120", Auto), MmaVariant::NvidiaMmaSync);
        assert_eq!(
            pick(amd, "gfx90a:sramecc+:xnack-", Native),
            MmaVariant::AmdMfma
        );
        assert_eq!(pick(amd, "gfx942", Native), MmaVariant::AmdMfma);
        assert_eq!(pick(amd, "gfx90a", Auto), MmaVariant::Simt);
        assert_eq!(pick(amd, "gfx1030", Native), MmaVariant::Simt);
        assert_eq!(pick(amd, "gfx1151", Auto), MmaVariant::Simt);
        assert_eq!(pick(amd, "gfx1151", Native), MmaVariant::AmdWmmaGfx11);
        assert_eq!(pick(amd, "gfx1201", Native), MmaVariant::AmdWmmaGfx12);
        assert_eq!(pick(nv, "sm_90", Simt), MmaVariant::Simt);
        assert_eq!(pick(amd, "gfx90a", Simt), MmaVariant::Simt);
        assert_eq!(MmaVariant::choose(amd, None, Native), MmaVariant::Simt);
        assert_eq!(MmaVariant::AmdMfma.compile_option(), "-DMMA_VARIANT=2");
    }

    #[test]
    fn the_setting_names_its_choices() {
        assert_eq!(MMA.value_of("simt"), Ok(MmaSetting::Simt));
        assert_eq!(MMA.value_of("auto"), Ok(MmaSetting::Auto));
        let e = MMA.value_of("wmma").unwrap_err().to_string();
        assert!(e.contains("HIPDECODE_MMA") && e.contains("native"), "{e}");
    }
}
