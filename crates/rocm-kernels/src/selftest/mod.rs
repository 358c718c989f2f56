//! Every kernel run against its CPU reference at small shapes, odd sizes and partial blocks
//! included: the table the GPU tests run, and what `hipdecode selftest` runs on a user's GPU.
//!
//! A [`Case`] launches one op (or a short chain) through [`crate::ops`] and records its
//! comparisons on a [`Rig`]. It never panics on a wrong result: a failed comparison is recorded
//! with its largest error, and the run goes on, so one report names every failing op.
//!
//! After a run, [`Report::not_launched`] lists the entry points of [`crate::KernelModule`] that
//! no case launched (from [`Kernels::entry_points_not_launched`]); the GPU test of this table
//! fails on any, so a kernel added to the source list without a case is noticed.
//!
//! [`crate::knobs::SELFTEST_BREAK`] (test only) perturbs the results of one op before they are
//! compared, so a test can check that the report names that op, and only it.

mod attention;
mod case;
mod dequant;
mod pointwise;
mod products;
mod rig;

pub use case::Case;
pub use rig::{Check, Rig};

use crate::Kernels;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// The cases of each group, in the order a run takes them.
pub mod groups {
    pub use super::attention::CASES as ATTENTION;
    pub use super::dequant::CASES as DEQUANT;
    pub use super::pointwise::CASES as POINTWISE;
    pub use super::products::CASES as PRODUCTS;
}

/// Every case of the table.
pub fn cases() -> Vec<Case> {
    [
        groups::POINTWISE,
        groups::PRODUCTS,
        groups::DEQUANT,
        groups::ATTENTION,
    ]
    .concat()
}

/// The op names of the table, each once, in table order.
pub fn ops() -> Vec<&'static str> {
    let mut ops: Vec<&'static str> = Vec::new();
    for case in cases() {
        if !ops.contains(&case.op) {
            ops.push(case.op);
        }
    }
    ops
}

/// How one case went.
#[derive(Clone, Debug)]
pub struct CaseOutcome {
    /// The case's name.
    pub name: &'static str,
    /// The case's op.
    pub op: &'static str,
    /// The comparisons it recorded.
    pub checks: Vec<Check>,
    /// An error or panic that stopped it, if one did.
    pub error: Option<String>,
    /// Wall time, launches and reference included.
    pub elapsed: Duration,
}

impl CaseOutcome {
    /// Whether it ran to the end, compared something, and every comparison held.
    pub fn passed(&self) -> bool {
        self.error.is_none() && !self.checks.is_empty() && self.checks.iter().all(|c| c.passed)
    }

    /// The largest error among its failed comparisons (or among all, when none failed).
    pub fn max_error(&self) -> Option<f64> {
        let failed: Vec<&Check> = self.checks.iter().filter(|c| !c.passed).collect();
        let pool = if failed.is_empty() {
            self.checks.iter().collect()
        } else {
            failed
        };
        pool.into_iter()
            .filter_map(|c| c.max_error)
            .fold(None, |m, e| Some(m.map_or(e, |m: f64| m.max(e))))
    }

    /// Why it failed, in one line: the error, or the first failed comparison.
    pub fn failure(&self) -> Option<String> {
        if let Some(e) = &self.error {
            return Some(e.clone());
        }
        if self.checks.is_empty() {
            return Some("the case compared nothing".to_string());
        }
        self.checks
            .iter()
            .find(|c| !c.passed)
            .map(|c| format!("{}: {}", c.what, c.detail))
    }
}

/// What a run of the table found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// One outcome per case run, in order.
    pub outcomes: Vec<CaseOutcome>,
    /// Entry points (`module/name`) of the loaded kernels that no case launched.
    pub not_launched: Vec<String>,
    /// Wall time of the cases (kernel loading not included).
    pub elapsed: Duration,
}

impl Report {
    /// Whether every case passed and every entry point was launched.
    pub fn passed(&self) -> bool {
        self.outcomes.iter().all(CaseOutcome::passed) && self.not_launched.is_empty()
    }

    /// The outcomes that failed.
    pub fn failures(&self) -> Vec<&CaseOutcome> {
        self.outcomes.iter().filter(|o| !o.passed()).collect()
    }
}

/// Options of [`run`].
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Run only the cases whose op or name contains this text.
    pub filter: Option<String>,
    /// The op whose results are perturbed ([`crate::knobs::SELFTEST_BREAK`]).
    pub break_op: Option<String>,
}

impl RunOptions {
    /// Options with the break switch read from the environment; an error naming the table's
    /// ops when it names none of them.
    pub fn from_env() -> crate::Result<RunOptions> {
        let knob = &crate::knobs::SELFTEST_BREAK;
        let break_op = knob.read()?;
        if let Some(op) = &break_op {
            if !ops().contains(&op.as_str()) {
                return Err(crate::KernelError::Env {
                    variable: knob.name,
                    value: op.clone(),
                    message: format!(
                        "names no op of the self-test; use one of {}",
                        ops().join(", ")
                    ),
                });
            }
        }
        Ok(RunOptions {
            filter: None,
            break_op,
        })
    }
}

/// Runs `cases` on `kernels`, calling `on_case` after each, and lists the entry points no case
/// launched. The kernels' launch record is cleared first, so the list covers this run only; it
/// is left empty when `options.filter` picks a subset.
///
/// `simt` is the build with the SIMT variant of the matrix-core layer that the native variants
/// are checked against ([`load_simt`]); `kernels` itself where that is their variant.
pub fn run(
    kernels: &Kernels,
    simt: &Kernels,
    cases: &[Case],
    options: &RunOptions,
    on_case: &mut dyn FnMut(&CaseOutcome),
) -> crate::Result<Report> {
    kernels.clear_launch_record();
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for case in cases {
        if let Some(filter) = &options.filter {
            if !case.op.contains(filter.as_str()) && !case.name.contains(filter.as_str()) {
                continue;
            }
        }
        let breaking = options.break_op.as_deref() == Some(case.op);
        let outcome = run_case(kernels, simt, case, breaking)?;
        on_case(&outcome);
        outcomes.push(outcome);
    }
    let not_launched = if options.filter.is_none() {
        kernels
            .entry_points_not_launched()
            .into_iter()
            .map(|(module, name)| format!("{}/{name}", module.name()))
            .collect()
    } else {
        Vec::new()
    };
    Ok(Report {
        outcomes,
        not_launched,
        elapsed: started.elapsed(),
    })
}

/// The kernels built with the SIMT variant of the matrix-core layer, for [`run`]; `None` when
/// `kernels` already are (their variant is SIMT on parts without matrix cores). Loading them
/// compiles every module again on a cold cache, so a caller that times the compile apart
/// loads them with the kernels.
pub fn load_simt(
    kernels: &Kernels,
    cache: &crate::cache::KernelCache,
) -> crate::Result<Option<Kernels>> {
    if kernels.mma_variant() == crate::mma::MmaVariant::Simt {
        return Ok(None);
    }
    Kernels::load_with_mma(kernels.device(), cache, crate::mma::MmaSetting::Simt).map(Some)
}

/// One case on a fresh stream. A panic inside it (a bug of the case or of a reference) is
/// caught and reported as its failure, so the rest of the table still runs.
fn run_case(
    kernels: &Kernels,
    simt: &Kernels,
    case: &Case,
    breaking: bool,
) -> crate::Result<CaseOutcome> {
    let started = Instant::now();
    let rig = Rig::new(kernels, simt, breaking)?;
    let result = catch_unwind(AssertUnwindSafe(|| (case.run)(&rig)));
    let error = match result {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(panic) => Some(format!("panicked: {}", panic_message(&panic))),
    };
    // Work still queued must finish before its buffers go; a failure here is the case's.
    let error = match (error, rig.finish()) {
        (None, Err(e)) => Some(e.to_string()),
        (error, _) => error,
    };
    Ok(CaseOutcome {
        name: case.name,
        op: case.op,
        checks: rig.into_checks(),
        error,
        elapsed: started.elapsed(),
    })
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_names_are_unique_and_every_op_is_named() {
        let all = cases();
        assert!(!all.is_empty());
        let mut names: Vec<&str> = all.iter().map(|c| c.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "two cases share a name");
        for case in &all {
            assert!(!case.op.is_empty() && !case.op.contains(' '), "{case:?}");
        }
    }

    fn outcome(checks: Vec<Check>, error: Option<&str>) -> CaseOutcome {
        CaseOutcome {
            name: "n",
            op: "o",
            checks,
            error: error.map(str::to_string),
            elapsed: Duration::ZERO,
        }
    }

    #[test]
    fn an_outcome_passes_only_with_checks_all_held_and_no_error() {
        let held = Check::new("a", Some(0.5), true, "ok");
        let failed = Check::new("b", Some(3.0), false, "3 > 1");
        assert!(outcome(vec![held.clone()], None).passed());
        assert!(!outcome(vec![], None).passed());
        assert!(!outcome(vec![held.clone()], Some("launch failed")).passed());
        let mixed = outcome(vec![held, failed], None);
        assert!(!mixed.passed());
        assert_eq!(mixed.max_error(), Some(3.0));
        assert_eq!(mixed.failure().as_deref(), Some("b: 3 > 1"));
    }
}
