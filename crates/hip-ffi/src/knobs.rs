//! The `HIPDECODE_*` variables this crate reads (see the `knobs` crate).

use knobs::{parse, Knob, Scope, Table};

/// A platform forced by [`PLATFORM`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForcedPlatform {
    Amd,
    Nvidia,
    /// No GPU platform: everything runs as on a machine without one.
    None,
}

impl ForcedPlatform {
    pub fn name(self) -> &'static str {
        match self {
            ForcedPlatform::Amd => "amd",
            ForcedPlatform::Nvidia => "nvidia",
            ForcedPlatform::None => "none",
        }
    }
}

pub static PLATFORM: Knob<Option<ForcedPlatform>> = Knob {
    name: "HIPDECODE_PLATFORM",
    default: "",
    doc: "force the GPU platform: amd, nvidia or none (unset: AMD first, then NVIDIA)",
    scope: Scope::Run,
    parse: |v| match v.trim() {
        "" => Ok(None),
        v => parse::choice(
            &v.to_ascii_lowercase(),
            &[
                ("amd", ForcedPlatform::Amd),
                ("nvidia", ForcedPlatform::Nvidia),
                ("none", ForcedPlatform::None),
            ],
        )
        .map(Some),
    },
};

pub static NVRTC_PATH: Knob<Option<String>> = Knob {
    name: "HIPDECODE_NVRTC_PATH",
    default: "",
    doc: "libnvrtc.so.<major>, or its folder, to compile kernels with on NVIDIA (unset: the \
          system's and pip's usual places)",
    scope: Scope::Run,
    parse: parse::text,
};

pub static REQUIRE_GPU: Knob<bool> = Knob {
    name: "HIPDECODE_REQUIRE_GPU",
    default: "0",
    doc: "1: a GPU test that finds no usable GPU fails instead of skipping",
    scope: Scope::Test,
    parse: parse::switch,
};

pub static REQUIRE_BLAS: Knob<bool> = Knob {
    name: "HIPDECODE_REQUIRE_BLAS",
    default: "0",
    doc: "1: the vendor GEMM library (hipBLASLt / cuBLASLt) must load, and the prefill tests \
          that expect it in use fail without it",
    scope: Scope::Test,
    parse: parse::switch,
};

pub static REQUIRE_RTC: Knob<bool> = Knob {
    name: "HIPDECODE_REQUIRE_RTC",
    default: "0",
    doc: "1: the run-time compilers (hiprtc and NVRTC) must load, so the kernel compile tests \
          fail instead of skipping",
    scope: Scope::Test,
    parse: parse::switch,
};

pub static TABLE: Table = &[
    &PLATFORM,
    &NVRTC_PATH,
    &REQUIRE_GPU,
    &REQUIRE_BLAS,
    &REQUIRE_RTC,
];
