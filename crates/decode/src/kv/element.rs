//! How a KV cache stores its values: the cache types of `-ctk` / `-ctv`, with the bytes each
//! takes and the values it gives back.

use rocm_kernels::reference::kv_q8::{self, Q8_0_BLOCK};

/// A KV cache's element type (llama.cpp's names, as `--cache-type-k` / `--cache-type-v` take
/// them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvType {
    /// Single precision: the CPU backend's default and the GPU's exact comparisons.
    F32,
    /// IEEE half (the GPU backend's default): half of f32's bytes, a relative rounding of
    /// 2^-11 per value.
    F16,
    /// ggml's q8_0: blocks of 32 values as an f16 scale and 32 signed bytes, 34 bytes per 32
    /// values (53.1 % of f16), a rounding of up to half of max|x|/127 per block
    /// (`rocm_kernels::reference::kv_q8`). Rows must be whole blocks.
    Q8_0,
}

/// Cache types llama.cpp takes that hipdecode does not store yet, and why.
const NOT_YET: &[(&str, &str)] = &[
    (
        "q4_0",
        "with it the mean NLL of SmolLM2 and Gemma 3 270M rose 7.5 % and 6.8 % over f16's, \
         where the bar is 2 % (docs/benchmark_results/kv-q4_0-nll-2026-12-06.md); q8_0 stores \
         53 % of f16's bytes within 0.1 %",
    ),
    ("q4_1", "not implemented"),
    ("q5_0", "not implemented"),
    ("q5_1", "not implemented"),
    ("iq4_nl", "not implemented"),
    (
        "bf16",
        "not implemented; f16 keeps more mantissa for the same bytes",
    ),
];

impl KvType {
    pub const ALL: [KvType; 3] = [KvType::F32, KvType::F16, KvType::Q8_0];

    /// The name `-ctk` takes and reports show.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// The type `name` names, or an error that lists the types taken.
    pub fn parse(name: &str) -> Result<KvType, String> {
        let lower = name.trim().to_ascii_lowercase();
        if let Some(t) = Self::ALL.into_iter().find(|t| t.name() == lower) {
            return Ok(t);
        }
        let taken = Self::ALL.map(KvType::name).join(", ");
        match NOT_YET.iter().find(|(n, _)| *n == lower) {
            Some((n, why)) => Err(format!(
                "the KV cache type {n} is not supported: {why}; use one of {taken}"
            )),
            None => Err(format!(
                "'{name}' is not a KV cache type; use one of {taken}"
            )),
        }
    }

    /// Bytes of `values` values stored as this type, or `None` where the count overflows or
    /// is not a whole number of q8_0 blocks.
    pub fn bytes(self, values: usize) -> Option<usize> {
        match self {
            KvType::F32 => values.checked_mul(4),
            KvType::F16 => values.checked_mul(2),
            KvType::Q8_0 => kv_q8::q8_0_row_bytes(values),
        }
    }

    /// Values per block of the type (1 for the float types): rows must be a multiple.
    pub fn block_values(self) -> usize {
        match self {
            KvType::Q8_0 => Q8_0_BLOCK,
            KvType::F32 | KvType::F16 => 1,
        }
    }

    /// `values` (a row of the cache) replaced by what this type gives back for them, as the
    /// GPU's store kernels round them: the CPU backend's way of holding a cache of this type
    /// in f32 rows, so its attention reads exactly the GPU's numbers.
    ///
    /// # Panics
    /// For q8_0, where `values` is not whole blocks (the context checks the row widths first).
    pub fn round(self, values: &mut [f32]) {
        match self {
            KvType::F32 => {}
            KvType::F16 => {
                for x in values {
                    *x = half::f16::from_f32(*x).to_f32();
                }
            }
            KvType::Q8_0 => {
                assert_eq!(values.len() % Q8_0_BLOCK, 0, "q8_0 rows are whole blocks");
                kv_q8::round_trip_q8_0(values);
            }
        }
    }
}

impl KvType {
    /// The one type of `-ctk` and `-ctv`: keys and values share a type here, so one flag
    /// sets both, and two that differ are an error rather than a silent choice.
    pub fn of_flags(k: Option<KvType>, v: Option<KvType>) -> Result<Option<KvType>, String> {
        match (k, v) {
            (Some(k), Some(v)) if k != v => Err(format!(
                "-ctk {k} and -ctv {v} differ, but hipdecode stores keys and values as one \
                 type; give both the same (e.g. -ctk {k} -ctv {k})"
            )),
            (k, v) => Ok(k.or(v)),
        }
    }
}

/// A binary's arguments with llama.cpp's `-ctk` / `-ctv` (multi-letter short flags, which
/// clap does not take) rewritten to `--cache-type-k` / `--cache-type-v`, so the flags users
/// know from llama.cpp work. Arguments after `--` are left alone.
pub fn expand_cache_type_flags(args: impl Iterator<Item = String>) -> Vec<String> {
    const ALIASES: [(&str, &str); 2] = [("-ctk", "--cache-type-k"), ("-ctv", "--cache-type-v")];
    let mut past_separator = false;
    args.map(|a| {
        past_separator |= a == "--";
        if past_separator {
            return a;
        }
        for (short, long) in ALIASES {
            if a == short {
                return long.to_string();
            }
            if let Some(value) = a.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
                return format!("{long}={value}");
            }
        }
        a
    })
    .collect()
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        KvType::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_unsupported_types_say_why() {
        for t in KvType::ALL {
            assert_eq!(KvType::parse(t.name()), Ok(t));
        }
        assert_eq!(KvType::parse("Q8_0"), Ok(KvType::Q8_0));
        let e = KvType::parse("q4_0").unwrap_err();
        assert!(
            e.contains("q4_0") && e.contains("7.5 %") && e.contains("q8_0"),
            "{e}"
        );
        let e = KvType::parse("int3").unwrap_err();
        assert!(e.contains("'int3'") && e.contains("f16"), "{e}");
    }

    #[test]
    fn llama_cpp_cache_type_flags_become_the_long_ones() {
        let of = |a: &[&str]| expand_cache_type_flags(a.iter().map(|s| s.to_string()));
        assert_eq!(
            of(&["run", "-ctk", "q8_0", "-ctv=q8_0", "-c", "64"]),
            [
                "run",
                "--cache-type-k",
                "q8_0",
                "--cache-type-v=q8_0",
                "-c",
                "64"
            ]
        );
        // A prompt after `--` is left alone.
        assert_eq!(of(&["run", "--", "-ctk"]), ["run", "--", "-ctk"]);
    }

    #[test]
    fn one_cache_type_flag_sets_both_and_two_that_differ_are_refused() {
        assert_eq!(KvType::of_flags(None, None), Ok(None));
        assert_eq!(
            KvType::of_flags(Some(KvType::Q8_0), None),
            Ok(Some(KvType::Q8_0))
        );
        assert_eq!(
            KvType::of_flags(None, Some(KvType::F32)),
            Ok(Some(KvType::F32))
        );
        let e = KvType::of_flags(Some(KvType::Q8_0), Some(KvType::F16)).unwrap_err();
        assert!(e.contains("-ctk q8_0") && e.contains("-ctv f16"), "{e}");
    }

    #[test]
    fn bytes_of_each_type() {
        assert_eq!(KvType::F32.bytes(64), Some(256));
        assert_eq!(KvType::F16.bytes(64), Some(128));
        assert_eq!(KvType::Q8_0.bytes(64), Some(68));
        assert_eq!(KvType::Q8_0.bytes(48), None);
        assert_eq!(KvType::F32.bytes(usize::MAX), None);
        // The bound: q8_0 at most 53.2 % of f16.
        let ratio = KvType::Q8_0.bytes(1 << 20).unwrap() as f64
            / KvType::F16.bytes(1 << 20).unwrap() as f64;
        assert!(ratio <= 0.532, "{ratio}");
    }

    #[test]
    fn rounding_is_what_each_type_holds() {
        let mut x: Vec<f32> = (0..32).map(|i| 0.1 + i as f32 / 3.0).collect();
        let orig = x.clone();
        KvType::F32.round(&mut x);
        assert_eq!(x, orig);
        KvType::F16.round(&mut x);
        assert!(x
            .iter()
            .zip(&orig)
            .all(|(a, b)| (a - b).abs() <= b.abs() * 1e-3));
        assert_ne!(x, orig);
        let mut y = orig.clone();
        KvType::Q8_0.round(&mut y);
        let step = orig.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
        assert!(y
            .iter()
            .zip(&orig)
            .all(|(a, b)| (a - b).abs() <= 0.51 * step + 1e-2 * step));
    }
}
