//! The `HIPDECODE_*` variables this crate reads (see the `knobs` crate).

use knobs::{parse, Knob, Scope, Table};
use std::path::PathBuf;

/// Where [`KERNEL_CACHE`] asks compiled kernels to be kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheSetting {
    /// `$XDG_CACHE_HOME/hipdecode/kernels`, else `$HOME/.cache/hipdecode/kernels`.
    Default,
    /// Compile every time.
    Off,
    /// This folder (created if missing; an error when unusable).
    Folder(PathBuf),
}

pub static KERNEL_CACHE: Knob<CacheSetting> = Knob {
    name: "HIPDECODE_KERNEL_CACHE",
    default: "",
    doc: "folder for compiled kernels, or `off` to compile every time (unset: \
          $XDG_CACHE_HOME/hipdecode/kernels, else ~/.cache/hipdecode/kernels)",
    scope: Scope::Run,
    parse: |v| {
        Ok(match v.trim() {
            "" => CacheSetting::Default,
            "off" => CacheSetting::Off,
            _ => CacheSetting::Folder(PathBuf::from(v)),
        })
    },
};

/// Depths [`MATVEC_DEPTH`] accepts.
const MATVEC_DEPTHS: &[u32] = &[1, 2, 4, 8];

pub static MATVEC_DEPTH: Knob<Option<u32>> = Knob {
    name: "HIPDECODE_MATVEC_DEPTH",
    default: "",
    doc: "weight blocks each lane of the int8 matrix-vector product loads ahead: 1, 2, 4 or 8 \
          (unset: the kernel's own); a tuning knob for A/B runs",
    scope: Scope::Run,
    parse: |v| match v.trim() {
        "" => Ok(None),
        t => match t.parse::<u32>() {
            Ok(depth) if MATVEC_DEPTHS.contains(&depth) => Ok(Some(depth)),
            _ => Err(format!(
                "not a supported depth; use one of {MATVEC_DEPTHS:?}, or unset it for the default"
            )),
        },
    },
};

/// Largest value [`MATVEC_BLOCKS_PER_SM`] accepts.
const MAX_BLOCKS_PER_SM: u32 = 64;

pub static MATVEC_BLOCKS_PER_SM: Knob<Option<u32>> = Knob {
    name: "HIPDECODE_MATVEC_BLOCKS_PER_SM",
    default: "",
    doc: "caps the warp-per-row int8 matrix-vector grid at this many blocks per multiprocessor, \
          1 to 64 (unset or 0: a block per group of rows); a tuning knob for A/B runs",
    scope: Scope::Run,
    parse: |v| match v.trim() {
        "" => Ok(None),
        t => match t.parse::<u32>() {
            Ok(0) => Ok(None),
            Ok(n) if n <= MAX_BLOCKS_PER_SM => Ok(Some(n)),
            _ => Err(format!(
                "not a block count; use a whole number from 1 to {MAX_BLOCKS_PER_SM}, or 0 (or \
                 unset) for no cap"
            )),
        },
    },
};

pub static EARLY_LAUNCH: Knob<bool> = Knob {
    name: "HIPDECODE_GPU_PDL",
    default: "auto",
    doc: "programmatic dependent launch, each kernel overlapping the end of the one before: \
          `auto` (where the device supports it) or `off`",
    scope: Scope::Run,
    parse: |v| parse::choice(v, &[("auto", true), ("off", false)]),
};

pub static SELFTEST_BREAK: Knob<Option<String>> = Knob {
    name: "HIPDECODE_SELFTEST_BREAK",
    default: "",
    doc: "test only: the self-test moves the results of this op before comparing them, so a \
          test can check that the report names that op and only it (unset: off)",
    scope: Scope::Test,
    // Whether the word names an op of the table is checked where the table is
    // (`selftest::RunOptions::from_env`), which this module must not depend on.
    parse: |v| match v.trim() {
        "" => Ok(None),
        op if op.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => Ok(Some(op.to_string())),
        _ => Err("is not an op name; use one word such as rms_norm".to_string()),
    },
};

pub static TABLE: Table = &[
    &KERNEL_CACHE,
    &MATVEC_DEPTH,
    &MATVEC_BLOCKS_PER_SM,
    &EARLY_LAUNCH,
    &crate::mma::MMA,
    &SELFTEST_BREAK,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tuning_knobs_take_their_ranges_and_name_the_variable_otherwise() {
        let env = |k: &Knob<Option<u32>>, v: &'static str| k.value_of(v);
        assert_eq!(env(&MATVEC_DEPTH, "4"), Ok(Some(4)));
        assert_eq!(env(&MATVEC_DEPTH, ""), Ok(None));
        assert_eq!(env(&MATVEC_BLOCKS_PER_SM, "0"), Ok(None));
        assert_eq!(env(&MATVEC_BLOCKS_PER_SM, "64"), Ok(Some(64)));
        for (knob, bad) in [
            (&MATVEC_DEPTH, "3"),
            (&MATVEC_BLOCKS_PER_SM, "65"),
            (&MATVEC_BLOCKS_PER_SM, "lots"),
        ] {
            let e = env(knob, bad).unwrap_err().to_string();
            assert!(e.contains(knob.name) && e.contains(bad), "{e}");
        }
        let pdl = |v| EARLY_LAUNCH.value_of(v);
        assert_eq!(pdl("off"), Ok(false));
        assert_eq!(pdl("auto"), Ok(true));
        assert!(pdl("on").unwrap_err().to_string().contains("'off'"));
    }
}
