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
    doc: "force the GPU platform: amd (or hip, rocm), nvidia (or cuda) or none (unset: AMD \
          first, then NVIDIA)",
    scope: Scope::Run,
    parse: |v| match v.trim() {
        "" => Ok(None),
        v => parse::choice(
            &v.to_ascii_lowercase(),
            &[
                ("amd", ForcedPlatform::Amd),
                ("hip", ForcedPlatform::Amd),
                ("rocm", ForcedPlatform::Amd),
                ("nvidia", ForcedPlatform::Nvidia),
                ("cuda", ForcedPlatform::Nvidia),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The names people use for each platform select it; anything else is an error that names
    /// the variable, the value and the choices.
    #[test]
    fn the_platform_takes_its_common_names_and_refuses_others() {
        for (v, want) in [
            ("amd", ForcedPlatform::Amd),
            ("HIP", ForcedPlatform::Amd),
            ("rocm", ForcedPlatform::Amd),
            ("nvidia", ForcedPlatform::Nvidia),
            ("cuda", ForcedPlatform::Nvidia),
            ("none", ForcedPlatform::None),
        ] {
            assert_eq!(PLATFORM.value_of(v), Ok(Some(want)), "{v}");
        }
        assert_eq!(PLATFORM.value_of(""), Ok(None));
        let e = PLATFORM.value_of("vulkan").unwrap_err().to_string();
        assert!(
            e.contains("HIPDECODE_PLATFORM") && e.contains("vulkan") && e.contains("nvidia"),
            "{e}"
        );
    }
}
