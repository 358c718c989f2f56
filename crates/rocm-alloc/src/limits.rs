//! Memory and cache limits: their defaults, and the text form that the `HIPDECODE_MEMORY_LIMIT`
//! / `HIPDECODE_CACHE_LIMIT` variables ([`crate::knobs`]) and the command lines use.
//!
//! Precedence, highest first: a value set through the API (`set_*_limit`, or the
//! [`crate::AllocatorConfig`] fields), then the environment variable, then the default below.
//! An explicit value always wins over a default.

use crate::device::{MemoryInfo, UmaInfo};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Share of a discrete card's total memory the allocator may reserve by default.
pub const DISCRETE_FRACTION: f64 = 0.90;
/// Host RAM kept for the OS, the process and the page cache on UMA devices: at least this...
pub const UMA_HOST_RESERVE_MIN: u64 = 4 * GIB;
/// ...or this share of host RAM, whichever is larger.
pub const UMA_HOST_RESERVE_FRACTION: f64 = 0.25;
/// Default cache limit: the idle bytes the cache is trimmed down to (by `trim`, and on a miss,
/// where segments used within the hot window are spared). It does not depend on the model.
///
/// Chosen by measurement (the memory study, `docs/benchmark_results/memory-study-2026-11-30.md`):
/// on an H200, `bench-decode --sweep` with alternating arms, 2 rounds and a fresh process per
/// run, decode tok/s was within noise of unbounded at every cache limit tried (4 MiB, 64 MiB,
/// 512 MiB, unbounded) on Gemma 3 270M, a Llama-3.1-8B Q4_K_M shape and a Qwen3-30B-A3B
/// Q4_K_M shape. At 4 MiB against unbounded: 8B 343.35 vs 342.75 t/s (+0.18 %), 30B-A3B
/// 309.20 vs 308.98 (+0.07 %), Gemma 1222.05 vs 1217.01 (+0.41 %). The rule: the smallest
/// bound within 2 % of unbounded on every model, which is the smallest one tried. The GPU
/// backend reserves every buffer a step uses when the model loads, so neither decode nor
/// prefill allocates and the cache limit does not touch their speed.
pub const DEFAULT_CACHE_LIMIT: u64 = 4 * MIB;

/// A limit as written by a user, before it is resolved against the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LimitSpec {
    /// No limit.
    Unbounded,
    /// An absolute byte count.
    Bytes(u64),
    /// A share of the device's total memory, in (0, 1].
    FractionOfDevice(f64),
}

impl LimitSpec {
    /// A share of device memory, checked: `share` must be above 0 and at most 1.
    pub fn fraction(share: f64) -> Result<LimitSpec, InvalidLimit> {
        let spec = LimitSpec::FractionOfDevice(share);
        spec.validate()?;
        Ok(spec)
    }

    /// Checks the value (the variants are public, so a spec may be built unchecked).
    pub fn validate(self) -> Result<(), InvalidLimit> {
        match self {
            // `!(f > 0 && f <= 1)` is also true for NaN.
            LimitSpec::FractionOfDevice(f) if !(f > 0.0 && f <= 1.0) => {
                Err(InvalidLimit { share: f })
            }
            _ => Ok(()),
        }
    }

    /// The limit in bytes (`None` = unbounded) for a device of `device_total` bytes, or an
    /// error for a share of device memory outside (0, 1].
    pub fn resolve(self, device_total: u64) -> Result<Option<u64>, InvalidLimit> {
        self.validate()?;
        Ok(match self {
            LimitSpec::Unbounded => None,
            LimitSpec::Bytes(b) => Some(b),
            LimitSpec::FractionOfDevice(f) => Some((device_total as f64 * f) as u64),
        })
    }
}

/// A [`LimitSpec::FractionOfDevice`] outside (0, 1], or NaN.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error(
    "LimitSpec::FractionOfDevice({share}) is not a share of device memory: it must be a number \
     above 0 and at most 1 (0.5 = half); use LimitSpec::Bytes for an absolute limit or \
     LimitSpec::Unbounded for none"
)]
pub struct InvalidLimit {
    /// The rejected share.
    pub share: f64,
}

/// The forms a limit's text may take, for the messages that refuse one.
pub const ACCEPTED_FORMS: &str = "a byte count (\"1073741824\"), a decimal with a binary suffix \
     K/M/G/T or KiB/MiB/GiB/TiB, any case (\"1.5GiB\", \"512m\"), a percentage of device memory \
     (\"50%\"), or \"0\"/\"none\" for unbounded";

/// Why a limit string was rejected. The message names where it came from, the value and the
/// forms that are accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{source_name}={value:?} is not a valid limit ({reason}); accepted forms: {ACCEPTED_FORMS}"
)]
pub struct LimitParseError {
    /// Where the value came from (the option's or the variable's name).
    pub source_name: String,
    /// The rejected text.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Parses a limit. `source_name` names where the text came from, for the error message.
pub fn parse_limit(source_name: &str, text: &str) -> Result<LimitSpec, LimitParseError> {
    parse_limit_reason(text).map_err(|reason| LimitParseError {
        source_name: source_name.to_string(),
        value: text.to_string(),
        reason: reason.to_string(),
    })
}

/// Parses a limit; the error is the reason followed by the accepted forms (what a knob's
/// parser returns).
pub fn parse_limit_text(text: &str) -> Result<LimitSpec, String> {
    parse_limit_reason(text).map_err(|reason| format!("{reason}; accepted forms: {ACCEPTED_FORMS}"))
}

fn parse_limit_reason(text: &str) -> Result<LimitSpec, &'static str> {
    let err = |reason: &'static str| reason;
    let t = text.trim();
    if t.is_empty() {
        return Err(err("empty value"));
    }
    let lower = t.to_ascii_lowercase();
    if lower == "none" || lower == "0" {
        return Ok(LimitSpec::Unbounded);
    }
    if let Some(num) = lower.strip_suffix('%') {
        let pct: f64 =
            parse_decimal(num.trim()).ok_or_else(|| err("the percentage is not a number"))?;
        if !(pct > 0.0 && pct <= 100.0) {
            return Err(err("a percentage must be above 0 and at most 100"));
        }
        return Ok(LimitSpec::FractionOfDevice(pct / 100.0));
    }
    let split = lower
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(lower.len());
    let (num, suffix) = lower.split_at(split);
    let num = num.trim();
    let multiplier: u64 = match suffix.trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(err("unknown unit suffix")),
    };
    if multiplier == 1 {
        if let Ok(b) = num.parse::<u64>() {
            return Ok(if b == 0 {
                LimitSpec::Unbounded
            } else {
                LimitSpec::Bytes(b)
            });
        }
        return Err(err(
            "a plain byte count must be a whole non-negative number",
        ));
    }
    let value =
        parse_decimal(num).ok_or_else(|| err("the number before the unit is not a decimal"))?;
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(err("the value does not fit in 64 bits"));
    }
    let bytes = bytes.round() as u64;
    Ok(if bytes == 0 {
        LimitSpec::Unbounded
    } else {
        LimitSpec::Bytes(bytes)
    })
}

/// Accepts only plain decimals (digits with at most one point), not Rust's "inf"/"nan"/"1e3".
fn parse_decimal(s: &str) -> Option<f64> {
    let ok = !s.is_empty()
        && s.chars().all(|c| c.is_ascii_digit() || c == '.')
        && s.chars().filter(|&c| c == '.').count() <= 1
        && s.chars().any(|c| c.is_ascii_digit());
    if ok {
        s.parse().ok()
    } else {
        None
    }
}

/// Default memory limit for a device.
///
/// Discrete: [`DISCRETE_FRACTION`] of the total, leaving room for what the runtime allocates
/// outside this allocator (BLAS handles and workspaces, code objects, the context itself).
///
/// UMA: the GPU can use 90% of the carve-out, plus GTT pages, which are host RAM. GTT is
/// capped by host RAM minus a reserve of max(4 GiB, 25% of RAM) for the OS, this process and
/// the page cache holding the memory-mapped model, because running host RAM out on an APU ends
/// in the OOM killer, not in an error the allocator could report.
pub fn default_memory_limit(info: &MemoryInfo) -> u64 {
    match info.uma {
        None => (info.total as f64 * DISCRETE_FRACTION) as u64,
        Some(uma) => uma_memory_limit(&uma),
    }
}

/// The UMA rule of [`default_memory_limit`].
pub fn uma_memory_limit(uma: &UmaInfo) -> u64 {
    let host_usable = uma.host_ram.saturating_sub(uma_host_reserve(uma.host_ram));
    (uma.carve_out as f64 * DISCRETE_FRACTION) as u64 + uma.gtt.min(host_usable)
}

/// Host RAM a UMA device's default memory limit leaves to the OS, this process and the page
/// cache: max([`UMA_HOST_RESERVE_MIN`], [`UMA_HOST_RESERVE_FRACTION`] of `host_ram`). The
/// simulated device's profiles use the same reserve to judge whether a run leaves it intact.
pub fn uma_host_reserve(host_ram: u64) -> u64 {
    UMA_HOST_RESERVE_MIN.max((host_ram as f64 * UMA_HOST_RESERVE_FRACTION) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<LimitSpec, LimitParseError> {
        parse_limit("HIPDECODE_CACHE_LIMIT", s)
    }

    #[test]
    fn accepted_forms() {
        assert_eq!(p("1048576"), Ok(LimitSpec::Bytes(1 << 20)));
        assert_eq!(p("1.5GiB"), Ok(LimitSpec::Bytes(3 << 29)));
        assert_eq!(p("1.5g"), Ok(LimitSpec::Bytes(3 << 29)));
        assert_eq!(p("512 MiB"), Ok(LimitSpec::Bytes(512 << 20)));
        assert_eq!(p("2K"), Ok(LimitSpec::Bytes(2048)));
        assert_eq!(p("2kib"), Ok(LimitSpec::Bytes(2048)));
        assert_eq!(p("1T"), Ok(LimitSpec::Bytes(1 << 40)));
        assert_eq!(p("1TiB"), Ok(LimitSpec::Bytes(1 << 40)));
        assert_eq!(p("50%"), Ok(LimitSpec::FractionOfDevice(0.5)));
        assert_eq!(p("0"), Ok(LimitSpec::Unbounded));
        assert_eq!(p("NONE"), Ok(LimitSpec::Unbounded));
        assert_eq!(p(" none "), Ok(LimitSpec::Unbounded));
    }

    #[test]
    fn rejected_forms_name_variable_value_and_forms() {
        for bad in [
            "", "abc", "12XB", "-5", "1.2.3G", "150%", "0%", "inf", "nan%", "1e3", "1.5",
        ] {
            let e = p(bad).expect_err(bad);
            let msg = e.to_string();
            assert!(msg.contains("HIPDECODE_CACHE_LIMIT"), "{msg}");
            assert!(msg.contains(&format!("{bad:?}")), "{msg}");
            assert!(msg.contains("50%") && msg.contains("none"), "{msg}");
        }
    }

    #[test]
    fn the_limit_knobs_read_unset_set_and_bad_values() {
        use crate::knobs::{CACHE_LIMIT, MEMORY_LIMIT, TABLE};
        use knobs::Env;
        assert_eq!(CACHE_LIMIT.value(&Env::default()), Ok(None));
        let set = Env::from_pairs([(CACHE_LIMIT.name, "1G")]);
        assert_eq!(CACHE_LIMIT.value(&set), Ok(Some(LimitSpec::Bytes(1 << 30))));
        let bad = Env::from_pairs([(MEMORY_LIMIT.name, "lots")]);
        let e = knobs::check(&[TABLE], &bad).unwrap_err().to_string();
        assert!(
            e.contains(MEMORY_LIMIT.name) && e.contains("\"lots\"") && e.contains("accepted forms"),
            "{e}"
        );
    }

    #[test]
    fn percentage_resolves_against_device_total() {
        assert_eq!(
            LimitSpec::FractionOfDevice(0.25).resolve(8 << 30),
            Ok(Some(2 << 30))
        );
        assert_eq!(
            LimitSpec::FractionOfDevice(1.0).resolve(8 << 30),
            Ok(Some(8 << 30))
        );
        assert_eq!(LimitSpec::Unbounded.resolve(8 << 30), Ok(None));
    }

    #[test]
    fn fractions_outside_zero_one_are_rejected() {
        for bad in [f64::NAN, 0.0, -0.5, 1.0001, f64::INFINITY, -0.0] {
            let e = LimitSpec::fraction(bad).expect_err("out of range");
            assert!(e.to_string().contains("above 0 and at most 1"), "{e}");
            let e = LimitSpec::FractionOfDevice(bad)
                .resolve(8 << 30)
                .expect_err("resolve checks too");
            assert!(e.share.is_nan() == bad.is_nan(), "{e}");
        }
        assert_eq!(
            LimitSpec::fraction(0.5),
            Ok(LimitSpec::FractionOfDevice(0.5))
        );
    }

    #[test]
    fn discrete_default_is_a_fraction_of_total() {
        let info = MemoryInfo {
            free: 10 << 30,
            total: 100 << 30,
            uma: None,
        };
        assert_eq!(default_memory_limit(&info), 90 << 30);
    }

    #[test]
    fn uma_default_respects_gtt_and_host_ram() {
        // 512 MiB carve-out, 64 GiB GTT, 128 GiB RAM: GTT is the binding term.
        let uma = UmaInfo {
            carve_out: 512 << 20,
            gtt: 64 << 30,
            host_ram: 128 << 30,
        };
        assert_eq!(uma_memory_limit(&uma), (512u64 << 20) * 9 / 10 + (64 << 30));
        // 16 GiB RAM with an oversized GTT: host RAM minus the 4 GiB reserve binds.
        let uma = UmaInfo {
            carve_out: 0,
            gtt: 16 << 30,
            host_ram: 16 << 30,
        };
        assert_eq!(uma_memory_limit(&uma), 12 << 30);
        // 96 GiB RAM: the reserve is 25% = 24 GiB.
        let uma = UmaInfo {
            carve_out: 0,
            gtt: 96 << 30,
            host_ram: 96 << 30,
        };
        assert_eq!(uma_memory_limit(&uma), 72 << 30);
    }

    #[test]
    fn cache_default_is_the_measured_four_mebibytes() {
        assert_eq!(DEFAULT_CACHE_LIMIT, 4 << 20);
    }
}
