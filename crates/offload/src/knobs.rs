//! The `HIPDECODE_*` variables this crate reads (see the `knobs` crate).

use crate::budget::{Budget, BudgetError};
use knobs::{Knob, Scope, Table};

pub static GPU_BUDGET: Knob<Option<Budget>> = Knob {
    name: "HIPDECODE_GPU_BUDGET",
    default: "",
    doc: "the cap on everything a run takes on the device when --gpu-budget is not given: \
          bytes (\"12GiB\") or a share of the device (\"75%\"); weights that do not fit are \
          offloaded (unset: no budget)",
    scope: Scope::Run,
    parse: |v| {
        if v.trim().is_empty() {
            return Ok(None);
        }
        match Budget::parse(GPU_BUDGET.name, v) {
            Ok(b) => Ok(Some(b)),
            Err(BudgetError::Parse { reason, .. }) => Err(format!(
                "{reason}; accepted forms: {}",
                crate::budget::BUDGET_FORMS
            )),
            Err(other) => Err(other.to_string()),
        }
    },
};

pub static RATES_FILE: Knob<Option<String>> = Knob {
    name: "HIPDECODE_RATES_FILE",
    default: "",
    doc: "where hipdecode probe-link and probe-host keep the rates they measured, which the \
          offload planner then uses: a file path, or `off` (unset: \
          $XDG_CACHE_HOME/hipdecode/measured-rates.json, else ~/.cache/hipdecode/...)",
    scope: Scope::Run,
    parse: knobs::parse::text,
};

pub static TABLE: Table = &[&GPU_BUDGET, &RATES_FILE];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_reads_sizes_and_shares_and_refuses_nothing() {
        let value = |v| GPU_BUDGET.value_of(v);
        assert_eq!(value("8GiB"), Ok(Some(Budget::Bytes(8 << 30))));
        assert_eq!(value(""), Ok(None));
        for bad in ["0", "lots", "none"] {
            let e = value(bad).unwrap_err().to_string();
            assert!(e.contains(GPU_BUDGET.name) && e.contains(bad), "{e}");
        }
    }
}
