//! Rates measured on this machine, kept between runs.
//!
//! `hipdecode probe-link` measures how fast a kernel reads pinned host memory in place and how
//! fast the copy engine moves it. `hipdecode probe-host` measures how fast the host's cores
//! compute offloaded products. Each probe records its figures in one small JSON file. The
//! planner's link model then takes them instead of the H200's defaults, and its `origin` says
//! which rate came from where, so `hipdecode plan` on another machine prices that machine's
//! link. A rate given on the command line still wins.
//!
//! The file is `HIPDECODE_RATES_FILE`, else `$XDG_CACHE_HOME/hipdecode/measured-rates.json`
//! (when that is an absolute path), else `$HOME/.cache/hipdecode/measured-rates.json`. `off`
//! turns the file off. A file that cannot be read or parsed is an error that names it and says
//! to run the probe again or delete it. It is never quietly skipped.

use crate::knobs::RATES_FILE;
use crate::link::LinkModel;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The link's rates from `hipdecode probe-link`.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkRates {
    /// The GPU they were measured on.
    pub device: String,
    /// Kernels reading pinned host memory in place, GB/s.
    pub zero_copy_gbps: f64,
    /// Copy-engine transfers from pinned host memory, GB/s.
    pub copy_gbps: f64,
    /// When, UTC (`2026-12-06T02:05:01Z`).
    pub measured_at: String,
}

/// The host's cores on offloaded products, from `hipdecode probe-host`.
#[derive(Clone, Debug, PartialEq)]
pub struct HostRate {
    /// GB/s of weights the host's cores compute: the slowest format the probe measured.
    pub gbps: f64,
    /// Threads that ran it.
    pub threads: usize,
    pub measured_at: String,
}

/// What the probes left on this machine.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MeasuredRates {
    pub link: Option<LinkRates>,
    pub host: Option<HostRate>,
}

/// Reading or writing the rates file failed.
#[derive(Debug, thiserror::Error)]
pub enum RatesError {
    #[error(
        "{path}: {source}; run `hipdecode probe-link` / `probe-host` again, or delete the file"
    )]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is not a measured-rates file ({reason}); run `hipdecode probe-link` / \
         `probe-host` again, or delete the file"
    )]
    Malformed { path: PathBuf, reason: String },
    #[error(transparent)]
    Knob(#[from] knobs::KnobError),
}

/// Where the rates live for this process (see the module docs); `None` when the file is off or
/// no folder can be named (no absolute `XDG_CACHE_HOME`, no `HOME`).
pub fn rates_path() -> Result<Option<PathBuf>, RatesError> {
    rates_path_from(RATES_FILE.read()?, |name| std::env::var_os(name))
}

/// As [`rates_path`], from the knob's value and a reader of `XDG_CACHE_HOME` and `HOME`.
pub fn rates_path_from(
    setting: Option<String>,
    var: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<Option<PathBuf>, RatesError> {
    match setting.as_deref() {
        Some("off") => return Ok(None),
        Some(path) => return Ok(Some(PathBuf::from(path))),
        None => {}
    }
    let cache = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")));
    Ok(cache.map(|c| c.join("hipdecode").join("measured-rates.json")))
}

fn positive(value: &Value, path: &Path, what: &str) -> Result<f64, RatesError> {
    match value.as_f64() {
        Some(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(RatesError::Malformed {
            path: path.to_path_buf(),
            reason: format!("{what} is {value}, not a positive number"),
        }),
    }
}

impl MeasuredRates {
    /// The rates in `path`; none when the file does not exist.
    pub fn load(path: &Path) -> Result<MeasuredRates, RatesError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(MeasuredRates::default())
            }
            Err(source) => {
                return Err(RatesError::Io {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        let malformed = |reason: String| RatesError::Malformed {
            path: path.to_path_buf(),
            reason,
        };
        let v: Value = serde_json::from_str(&text).map_err(|e| malformed(e.to_string()))?;
        let text_of = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let link = match &v["link"] {
            Value::Null => None,
            l => Some(LinkRates {
                device: text_of(&l["device"]),
                zero_copy_gbps: positive(&l["zero_copy_gbps"], path, "link.zero_copy_gbps")?,
                copy_gbps: positive(&l["copy_gbps"], path, "link.copy_gbps")?,
                measured_at: text_of(&l["measured_at"]),
            }),
        };
        let host = match &v["host"] {
            Value::Null => None,
            h => Some(HostRate {
                gbps: positive(&h["gbps"], path, "host.gbps")?,
                threads: h["threads"].as_u64().unwrap_or(0) as usize,
                measured_at: text_of(&h["measured_at"]),
            }),
        };
        Ok(MeasuredRates { link, host })
    }

    /// Writes the rates to `path` (its folder made when missing), through a temporary file
    /// renamed over it, so a reader sees the old file or the new one.
    pub fn save(&self, path: &Path) -> Result<(), RatesError> {
        let io = |source| RatesError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let value = json!({
            "link": self.link.as_ref().map(|l| json!({
                "device": l.device,
                "zero_copy_gbps": l.zero_copy_gbps,
                "copy_gbps": l.copy_gbps,
                "measured_at": l.measured_at,
            })),
            "host": self.host.as_ref().map(|h| json!({
                "gbps": h.gbps,
                "threads": h.threads,
                "measured_at": h.measured_at,
            })),
        });
        let text = serde_json::to_string_pretty(&value).unwrap_or_default() + "\n";
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// `link` with the measured rates in place of its zero-copy, copy and host-compute rates,
    /// and an origin that names each rate's source. The host rate is taken only where `link`
    /// computes on the host at all (the split is on).
    pub fn apply(&self, link: LinkModel) -> LinkModel {
        if self.link.is_none() && self.host.is_none() {
            return link;
        }
        let mut out = link.clone();
        let mut parts = Vec::new();
        if let Some(l) = &self.link {
            out.zero_copy_read = l.zero_copy_gbps * 1e9;
            out.copy = l.copy_gbps * 1e9;
            parts.push(format!(
                "zero-copy {:.1} and copy {:.1} GB/s measured by hipdecode probe-link on {} at {}",
                l.zero_copy_gbps, l.copy_gbps, l.device, l.measured_at
            ));
        }
        match &self.host {
            Some(h) if link.host_compute > 0.0 => {
                out.host_compute = h.gbps * 1e9;
                parts.push(format!(
                    "host compute {:.1} GB/s measured by hipdecode probe-host ({} threads) at {}",
                    h.gbps, h.threads, h.measured_at
                ));
            }
            _ => {}
        }
        parts.push(format!("the rest from {}", link.origin));
        out.origin = parts.join("; ");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir()
            .join(format!("offload-rates-{}-{name}", std::process::id()))
            .join("measured-rates.json")
    }

    #[test]
    fn rates_round_trip_and_replace_the_defaults_they_cover() {
        let path = scratch("round-trip");
        assert_eq!(
            MeasuredRates::load(&path).unwrap(),
            MeasuredRates::default()
        );
        let rates = MeasuredRates {
            link: Some(LinkRates {
                device: "Radeon RX 9060 XT".into(),
                zero_copy_gbps: 24.5,
                copy_gbps: 26.0,
                measured_at: "2026-12-06T02:05:01Z".into(),
            }),
            host: None,
        };
        rates.save(&path).unwrap();
        assert_eq!(MeasuredRates::load(&path).unwrap(), rates);
        let link = rates.apply(LinkModel::h200_default());
        assert_eq!((link.zero_copy_read, link.copy), (24.5e9, 26.0e9));
        // What was not measured keeps the default, and the origin says which is which.
        assert_eq!(link.device_read, LinkModel::h200_default().device_read);
        assert_eq!(link.host_compute, LinkModel::h200_default().host_compute);
        assert!(
            link.origin.contains("probe-link on Radeon RX 9060 XT"),
            "{}",
            link.origin
        );
        assert!(
            link.origin.contains("the rest from H200 defaults"),
            "{}",
            link.origin
        );
        std::fs::remove_dir_all(path.parent().unwrap()).ok();
    }

    #[test]
    fn a_host_rate_counts_only_where_the_split_is_on() {
        let rates = MeasuredRates {
            link: None,
            host: Some(HostRate {
                gbps: 12.0,
                threads: 8,
                measured_at: "t".into(),
            }),
        };
        let on = rates.apply(LinkModel::h200_default());
        assert_eq!(on.host_compute, 12e9);
        let off = rates.apply(LinkModel::h200_default().with_host_compute_gbps(0.0));
        assert_eq!(off.host_compute, 0.0);
        assert!(!off.origin.contains("probe-host"), "{}", off.origin);
    }

    #[test]
    fn a_broken_file_is_an_error_naming_it_and_the_fix() {
        let path = scratch("broken");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        for text in [
            "not json",
            r#"{"link":{"zero_copy_gbps":-1,"copy_gbps":5}}"#,
        ] {
            std::fs::write(&path, text).unwrap();
            let e = MeasuredRates::load(&path).unwrap_err().to_string();
            assert!(
                e.contains("measured-rates.json") && e.contains("probe-link"),
                "{e}"
            );
        }
        std::fs::remove_dir_all(path.parent().unwrap()).ok();
    }

    #[test]
    fn the_file_follows_the_variable_then_the_cache_folders() {
        let none = |_: &str| None;
        assert_eq!(rates_path_from(Some("off".into()), none).unwrap(), None);
        assert_eq!(
            rates_path_from(Some("/r.json".into()), none).unwrap(),
            Some(PathBuf::from("/r.json"))
        );
        let vars = |name: &str| match name {
            "XDG_CACHE_HOME" => Some("relative".into()),
            "HOME" => Some("/home/u".into()),
            _ => None,
        };
        assert_eq!(
            rates_path_from(None, vars).unwrap(),
            Some(PathBuf::from(
                "/home/u/.cache/hipdecode/measured-rates.json"
            ))
        );
        assert_eq!(rates_path_from(None, none).unwrap(), None);
    }
}
