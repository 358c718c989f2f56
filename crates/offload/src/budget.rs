//! The GPU budget: `--gpu-budget` / `HIPDECODE_GPU_BUDGET`, the cap on everything a run may
//! take on the device.
//!
//! The text is parsed by rocm-alloc's own limit parser ([`rocm_alloc::limits::parse_limit`]),
//! the one that reads `HIPDECODE_MEMORY_LIMIT` and `HIPDECODE_CACHE_LIMIT`, so a value means
//! the same thing in all three places: a plain byte count, a decimal with a binary unit (`K`,
//! `KB` and `KiB` all mean 1024; there is no decimal kilobyte), or a percentage of the device.
//! The one difference is that a budget has no "unbounded" form: the allocator's `0` and `none`
//! are refused here, because a run without a budget is a run without the flag, and a budget of
//! nothing is a mistake rather than a request.

use rocm_alloc::limits::{parse_limit, LimitSpec};
use std::fmt;

/// The forms a budget may take, as every error states them.
pub const BUDGET_FORMS: &str = "a byte count (\"12345\"), a decimal with a binary unit \
     K/M/G/T, KB/MB/GB/TB or KiB/MiB/GiB/TiB in any case, every one a power of 1024 \
     (\"512MiB\", \"6.5GiB\", \"8g\"), or a percentage of the device's memory above 0 and at \
     most 100 (\"75%\")";

/// The forms a plain size (`--device-memory`) may take.
pub const SIZE_FORMS: &str = "a byte count (\"150754820096\") or a decimal with a binary unit \
     K/M/G/T, KB/MB/GB/TB or KiB/MiB/GiB/TiB in any case, every one a power of 1024 \
     (\"140.4GiB\")";

const MIB: f64 = (1u64 << 20) as f64;

/// A budget as written, before it is resolved against the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    /// An absolute byte count (at least 1).
    Bytes(u64),
    /// A share of the device's total memory, in (0, 1].
    FractionOfDevice(f64),
}

/// Why a budget (or a size) was refused. Every message names the value and what to write
/// instead.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BudgetError {
    /// The text is not one of the accepted forms.
    #[error("{source_name}={value:?} is not a valid GPU budget ({reason}); accepted forms: {BUDGET_FORMS}")]
    Parse {
        /// Where the text came from: the flag or the variable.
        source_name: String,
        /// The rejected text.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A size that must be a plain amount of bytes is not one.
    #[error(
        "{source_name}={value:?} is not a valid size ({reason}); accepted forms: {SIZE_FORMS}"
    )]
    Size {
        /// Where the text came from.
        source_name: String,
        /// The rejected text.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A percentage needs the device's total, and nobody could say what it is.
    #[error(
        "the GPU budget {budget} is a share of the device's memory, and the device's total is \
         not known: pass --device-memory BYTES (e.g. 141GiB), run where the GPU can be asked, \
         or give the budget in bytes (e.g. 8GiB)"
    )]
    NeedsDeviceTotal {
        /// The budget as written.
        budget: String,
    },
    /// The budget is more than the device has.
    #[error(
        "the GPU budget of {budget_mib:.1} MiB is more than the device's {device_mib:.1} MiB; \
         give at most the device's memory, or a percentage such as \"90%\""
    )]
    AboveDevice {
        /// The budget in MiB.
        budget_mib: f64,
        /// The device's total in MiB.
        device_mib: f64,
    },
}

impl Budget {
    /// Parses a budget; `source_name` (the flag or the variable) is named in the error.
    pub fn parse(source_name: &str, text: &str) -> Result<Budget, BudgetError> {
        let err = |reason: String| BudgetError::Parse {
            source_name: source_name.to_string(),
            value: text.to_string(),
            reason,
        };
        match parse_limit(source_name, text) {
            Err(e) => Err(err(e.reason)),
            Ok(LimitSpec::Unbounded) => Err(err(
                "a budget must be more than 0 bytes; to run without one, leave the flag and \
                 the variable unset"
                    .into(),
            )),
            Ok(LimitSpec::Bytes(b)) => Ok(Budget::Bytes(b)),
            Ok(LimitSpec::FractionOfDevice(f)) => Ok(Budget::FractionOfDevice(f)),
        }
    }

    /// Whether resolving needs the device's total memory.
    pub fn needs_device_total(self) -> bool {
        matches!(self, Budget::FractionOfDevice(_))
    }

    /// The budget in bytes. A percentage needs `device_total`; when the total is known, a
    /// budget above it is refused (the planner would otherwise promise memory that is not
    /// there).
    pub fn resolve(self, device_total: Option<u64>) -> Result<u64, BudgetError> {
        let bytes = match (self, device_total) {
            (Budget::Bytes(b), _) => b,
            (Budget::FractionOfDevice(f), Some(total)) => (total as f64 * f) as u64,
            (Budget::FractionOfDevice(_), None) => {
                return Err(BudgetError::NeedsDeviceTotal {
                    budget: self.to_string(),
                })
            }
        };
        match device_total {
            Some(total) if bytes > total => Err(BudgetError::AboveDevice {
                budget_mib: bytes as f64 / MIB,
                device_mib: total as f64 / MIB,
            }),
            _ => Ok(bytes),
        }
    }
}

impl std::str::FromStr for Budget {
    type Err = BudgetError;

    /// Parses a `--gpu-budget` value.
    fn from_str(s: &str) -> Result<Budget, BudgetError> {
        Budget::parse("--gpu-budget", s)
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Bytes(b) => write!(f, "{:.1} MiB", *b as f64 / MIB),
            Budget::FractionOfDevice(share) => write!(f, "{}%", share * 100.0),
        }
    }
}

/// Parses a plain size in bytes (`--device-memory`) with the same number and unit rules as a
/// budget; a percentage or a zero is refused, since a size is what a percentage is taken of.
pub fn parse_size(source_name: &str, text: &str) -> Result<u64, BudgetError> {
    let err = |reason: String| BudgetError::Size {
        source_name: source_name.to_string(),
        value: text.to_string(),
        reason,
    };
    match parse_limit(source_name, text) {
        Err(e) => Err(err(e.reason)),
        Ok(LimitSpec::Bytes(b)) => Ok(b),
        Ok(LimitSpec::Unbounded) => Err(err("a size must be more than 0 bytes".into())),
        Ok(LimitSpec::FractionOfDevice(_)) => Err(err(
            "a size cannot be a percentage: it is what percentages are of".into(),
        )),
    }
}

/// A knob's optional size: `None` for an empty value, else [`parse_size`], its error worded for
/// the knob's message with the accepted forms.
pub fn parse_optional_size(knob_name: &str, text: &str) -> Result<Option<u64>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    parse_size(knob_name, text).map(Some).map_err(|e| match e {
        BudgetError::Size { reason, .. } => format!("{reason}; accepted forms: {SIZE_FORMS}"),
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Budget, BudgetError> {
        Budget::parse("--gpu-budget", s)
    }

    #[test]
    fn accepted_forms() {
        assert_eq!(p("12345"), Ok(Budget::Bytes(12345)));
        assert_eq!(p("512MiB"), Ok(Budget::Bytes(512 << 20)));
        assert_eq!(p("8GiB"), Ok(Budget::Bytes(8 << 30)));
        assert_eq!(p("6.5GiB"), Ok(Budget::Bytes(13 << 29)));
        assert_eq!(p("6.5 gib"), Ok(Budget::Bytes(13 << 29)));
        // As for the allocator's variables, every unit is binary: GB is GiB.
        assert_eq!(p("8GB"), p("8GiB"));
        assert_eq!(p("8g"), p("8GiB"));
        assert_eq!(p("75%"), Ok(Budget::FractionOfDevice(0.75)));
        assert_eq!(p(" 100% "), Ok(Budget::FractionOfDevice(1.0)));
    }

    #[test]
    fn rejected_forms_name_the_value_and_the_forms() {
        for bad in [
            "",
            "0",
            "none",
            "0GiB",
            "abc",
            "8 parsecs",
            "-1G",
            "1.5",
            "1e9",
            "inf",
            "0%",
            "150%",
            "nan%",
            "1.2.3G",
            "12XB",
        ] {
            let e = p(bad).expect_err(bad).to_string();
            assert!(e.contains("--gpu-budget"), "{e}");
            assert!(e.contains(&format!("{bad:?}")), "{e}");
            assert!(
                e.contains("accepted forms") && e.contains("75%") && e.contains("6.5GiB"),
                "{e}"
            );
        }
        let e = p("none").unwrap_err().to_string();
        assert!(e.contains("more than 0 bytes"), "{e}");
    }

    #[test]
    fn a_percentage_needs_the_device_total() {
        let b = Budget::FractionOfDevice(0.5);
        assert!(b.needs_device_total());
        assert_eq!(b.resolve(Some(8 << 30)), Ok(4 << 30));
        let e = b.resolve(None).unwrap_err().to_string();
        assert!(e.contains("--device-memory") && e.contains("50%"), "{e}");
        assert_eq!(Budget::Bytes(5).resolve(None), Ok(5));
    }

    #[test]
    fn a_budget_above_the_device_is_refused() {
        let e = Budget::Bytes(9 << 30).resolve(Some(8 << 30)).unwrap_err();
        assert!(e.to_string().contains("9216.0 MiB"), "{e}");
        assert!(e.to_string().contains("8192.0 MiB"), "{e}");
    }

    #[test]
    fn sizes_refuse_percentages_and_zero() {
        assert_eq!(parse_size("--device-memory", "141GiB"), Ok(141 << 30));
        for bad in ["50%", "0", "none", "lots"] {
            let e = parse_size("--device-memory", bad).unwrap_err().to_string();
            assert!(
                e.contains("--device-memory") && e.contains("accepted forms"),
                "{e}"
            );
        }
    }
}
