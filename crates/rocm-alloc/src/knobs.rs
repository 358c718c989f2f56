//! The `HIPDECODE_*` variables this crate reads (see the `knobs` crate).

use crate::limits::{parse_limit_text, LimitSpec};
use knobs::{parse, Knob, Scope, Table};

fn limit(text: &str) -> Result<Option<LimitSpec>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    parse_limit_text(text).map(Some)
}

pub static MEMORY_LIMIT: Knob<Option<LimitSpec>> = Knob {
    name: "HIPDECODE_MEMORY_LIMIT",
    default: "",
    doc: "the most device memory the allocator reserves: bytes (\"12GiB\"), a share (\"80%\") \
          or \"none\" (unset: 90% of a card; on an APU the carve-out's 90% plus the GTT that \
          leaves the host max(4 GiB, 25%))",
    scope: Scope::Run,
    parse: limit,
};

pub static CACHE_LIMIT: Knob<Option<LimitSpec>> = Knob {
    name: "HIPDECODE_CACHE_LIMIT",
    default: "",
    doc: "idle bytes the cache keeps before trimming, in the same forms (unset: 4 MiB, chosen \
          by the memory study)",
    scope: Scope::Run,
    parse: limit,
};

pub static TRIM_WINDOW: Knob<Option<u64>> = Knob {
    name: "HIPDECODE_TRIM_WINDOW",
    default: "",
    doc: "allocations an idle segment is spared from automatic trims, a whole number (unset: \
          4096, a few decode steps of a large model; 0 spares nothing)",
    scope: Scope::Run,
    parse: |text| match text.trim() {
        "" => Ok(None),
        t if t.chars().all(|c| c.is_ascii_digit()) => t
            .parse()
            .map(Some)
            .map_err(|_| "the number is too large".into()),
        _ => Err(
            "give a whole number of allocations, e.g. \"4096\" or \"0\" to spare nothing".into(),
        ),
    },
};

pub static WRITE_TRACES: Knob<bool> = Knob {
    name: "HIPDECODE_WRITE_TRACES",
    default: "0",
    doc: "1: the replay tests rewrite their committed traces instead of checking them",
    scope: Scope::Test,
    parse: parse::switch,
};

pub static TABLE: Table = &[&MEMORY_LIMIT, &CACHE_LIMIT, &TRIM_WINDOW, &WRITE_TRACES];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trim_window_takes_whole_numbers_and_names_the_variable_on_error() {
        let value = |v: &str| TRIM_WINDOW.value_of(v);
        assert_eq!(value("0"), Ok(Some(0)));
        assert_eq!(value(" 65536 "), Ok(Some(65536)));
        assert_eq!(value(""), Ok(None));
        for bad in ["-1", "1.5", "4k", "lots", "99999999999999999999999"] {
            let e = value(bad).unwrap_err().to_string();
            assert!(e.contains(TRIM_WINDOW.name) && e.contains(bad), "{e}");
        }
    }
}
