//! What a case works with: the kernels, a stream, device buffers, and the comparisons it
//! records (never panicking on a wrong result).

use crate::mma::MmaVariant;
use crate::{DeviceSlice, DeviceSliceMut, KernelError, Kernels};
use hip_ffi::{DeviceBuffer, DeviceCopy, Stream};
use std::cell::RefCell;
use std::fmt::Display;

/// One comparison of a case.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// What was compared.
    pub what: String,
    /// The largest |gpu - reference| where the comparison measures one.
    pub max_error: Option<f64>,
    /// Whether it held.
    pub passed: bool,
    /// The numbers behind the verdict (the bound, the first bad index).
    pub detail: String,
}

impl Check {
    /// A comparison's record.
    pub fn new(what: &str, max_error: Option<f64>, passed: bool, detail: impl Display) -> Check {
        Check {
            what: what.to_string(),
            max_error,
            passed,
            detail: detail.to_string(),
        }
    }
}

/// What a case launches on and records its comparisons in.
pub struct Rig<'k> {
    kernels: &'k Kernels,
    simt: &'k Kernels,
    stream: Stream,
    breaking: bool,
    // A cell, so a case can record while it holds the rig's stream and kernels.
    checks: RefCell<Vec<Check>>,
}

/// How far [`Rig`] moves one value of a broken op's result: beyond any tolerance a case uses.
const BREAK_OFFSET: f32 = 1.0;

impl<'k> Rig<'k> {
    pub(super) fn new(
        kernels: &'k Kernels,
        simt: &'k Kernels,
        breaking: bool,
    ) -> crate::Result<Rig<'k>> {
        Ok(Rig {
            kernels,
            simt,
            stream: Stream::new(kernels.device())?,
            breaking,
            checks: RefCell::new(Vec::new()),
        })
    }

    /// The kernels under test.
    pub fn kernels(&self) -> &'k Kernels {
        self.kernels
    }

    /// The kernels with the SIMT variant of the matrix-core layer, whatever the device has.
    pub fn simt_kernels(&self) -> crate::Result<&'k Kernels> {
        if self.simt.mma_variant() == MmaVariant::Simt {
            Ok(self.simt)
        } else {
            Err(self.failure(format!(
                "the SIMT build was asked for, the {:?} variant given",
                self.simt.mma_variant()
            )))
        }
    }

    /// The case's stream; every launch of the case goes on it.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// A device copy of `data` (at least 4 bytes, so an empty slice still has an address).
    pub fn upload<T: DeviceCopy>(&self, data: &[T]) -> crate::Result<DeviceBuffer> {
        let bytes = std::mem::size_of_val(data).max(4);
        let mut buf = DeviceBuffer::alloc(self.kernels.device(), bytes)?;
        if !data.is_empty() {
            buf.copy_from_host(data)?;
        }
        Ok(buf)
    }

    /// A device buffer of `len` values of `T`, every byte `fill` (so a value the kernel should
    /// have written and did not shows).
    pub fn filled<T>(&self, len: usize, fill: u8) -> crate::Result<DeviceBuffer> {
        let bytes = (len * std::mem::size_of::<T>()).max(4);
        let mut buf = DeviceBuffer::alloc(self.kernels.device(), bytes)?;
        buf.memset(fill)?;
        Ok(buf)
    }

    /// A view of the first `len` values of `buf`; an error when it holds fewer.
    pub fn view<T>(&self, buf: &DeviceBuffer, len: usize) -> crate::Result<DeviceSlice<T>> {
        fits::<T>(buf, len)?;
        // SAFETY: the buffer holds `len` values of T (checked above). No launch outlives the
        // memory it uses: the rig synchronizes the stream before any buffer is read back, and a
        // buffer dropped with work still queued (a case that returns early) is freed by hipFree
        // or cuMemFree, which wait for that work first.
        Ok(unsafe { DeviceSlice::from_raw(buf.ptr().0, len) })
    }

    /// A mutable view of the first `len` values of `buf`; an error when it holds fewer.
    pub fn view_mut<T>(&self, buf: &DeviceBuffer, len: usize) -> crate::Result<DeviceSliceMut<T>> {
        fits::<T>(buf, len)?;
        // SAFETY: as `view`; a case's launches run in order on its one stream, so no two write
        // the buffer at once.
        Ok(unsafe { DeviceSliceMut::from_raw(buf.ptr().0, len) })
    }

    /// The first `len` values of `buf`, after the stream's work is done.
    pub fn download<T: DeviceCopy>(&self, buf: &DeviceBuffer, len: usize) -> crate::Result<Vec<T>> {
        self.stream.synchronize()?;
        let mut all: Vec<T> = buf.to_host_vec()?;
        if all.len() < len {
            return Err(self.failure(format!(
                "downloading {len} values from a buffer of {}",
                all.len()
            )));
        }
        all.truncate(len);
        Ok(all)
    }

    /// An error of the case itself (a set-up it could not do), as a [`KernelError`].
    pub fn failure(&self, message: impl Into<String>) -> KernelError {
        KernelError::Shape {
            op: "selftest",
            message: message.into(),
        }
    }

    /// Records that every `got[i]` is within `abs + rel * |want[i]|` of `want[i]`. NaN on
    /// either side, or a length mismatch, fails.
    pub fn close(&self, what: &str, got: &[f32], want: &[f32], rel: f32, abs: f32) {
        self.compare(what, got, want, |_, w| {
            f64::from(abs) + f64::from(rel) * f64::from(w).abs()
        });
    }

    /// Records that every `got[i]` is within `bound` of `want[i]`. NaN on either side, or a
    /// length mismatch, fails.
    pub fn within(&self, what: &str, got: &[f32], want: &[f32], bound: f64) {
        self.compare(what, got, want, |_, _| bound);
    }

    /// Records that every `got[i]` is within `bound(i)` of `want[i]`: a tolerance that depends
    /// on the inputs behind each value.
    pub fn within_each(&self, what: &str, got: &[f32], want: &[f32], bound: impl Fn(usize) -> f64) {
        self.compare(what, got, want, |i, _| bound(i));
    }

    /// Records that every `got[i]` is within `tol * max(1, RMS(want))` of `want[i]`: the scale a
    /// tolerance for a whole product or attention output is stated in.
    pub fn close_to_rms(&self, what: &str, got: &[f32], want: &[f32], tol: f64) {
        let rms = rms(want);
        self.compare(what, got, want, |_, _| tol * rms.max(1.0));
    }

    /// Records that `got` and `want` are the same values (bit for bit for floats, through the
    /// caller's conversion to bits).
    pub fn equal<T: PartialEq + std::fmt::Debug>(&self, what: &str, got: &[T], want: &[T]) {
        let check = if got.len() != want.len() {
            Check::new(
                what,
                None,
                false,
                format!("{} values against {}", got.len(), want.len()),
            )
        } else if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            let differ = (0..got.len()).filter(|&i| got[i] != want[i]).count();
            Check::new(
                what,
                None,
                false,
                format!(
                    "{differ} of {} differ; first at {i}: got {:?}, want {:?}",
                    got.len(),
                    got[i],
                    want[i]
                ),
            )
        } else if self.breaking {
            Check::new(
                what,
                None,
                false,
                "equal, but the op is perturbed by HIPDECODE_SELFTEST_BREAK",
            )
        } else {
            Check::new(what, None, true, format!("{} values equal", got.len()))
        };
        self.checks.borrow_mut().push(check);
    }

    /// Records a condition the case states in words (a property, not a comparison of values).
    pub fn holds(&self, what: &str, ok: bool, detail: impl Display) {
        let (ok, detail) = if ok && self.breaking {
            (
                false,
                format!("{detail} (perturbed by HIPDECODE_SELFTEST_BREAK)"),
            )
        } else {
            (ok, detail.to_string())
        };
        self.checks
            .borrow_mut()
            .push(Check::new(what, None, ok, detail));
    }

    /// Records that an operation was refused with an error whose message contains every one of
    /// `needles` (the checks of bad shapes).
    pub fn refused<T>(&self, what: &str, result: crate::Result<T>, needles: &[&str]) {
        match result {
            Ok(_) => self.holds(what, false, "was accepted; it should have been refused"),
            Err(e) => {
                let message = e.to_string();
                let missing: Vec<&&str> =
                    needles.iter().filter(|n| !message.contains(**n)).collect();
                self.holds(
                    what,
                    missing.is_empty(),
                    format!("refused with {message:?}; missing {missing:?}"),
                );
            }
        }
    }

    fn compare(&self, what: &str, got: &[f32], want: &[f32], allowed: impl Fn(usize, f32) -> f64) {
        let mut got = got.to_vec();
        if self.breaking {
            if let Some(first) = got.first_mut() {
                *first += BREAK_OFFSET + allowed(0, want.first().copied().unwrap_or(0.0)) as f32;
            }
        }
        self.checks
            .borrow_mut()
            .push(compare(what, &got, want, allowed));
    }

    /// Waits for the case's queued work.
    pub(super) fn finish(&self) -> crate::Result<()> {
        Ok(self.stream.synchronize()?)
    }

    pub(super) fn into_checks(self) -> Vec<Check> {
        self.checks.into_inner()
    }
}

fn fits<T>(buf: &DeviceBuffer, len: usize) -> crate::Result<()> {
    let need = len * std::mem::size_of::<T>();
    crate::error::check_shape(need <= buf.len_bytes(), "selftest", || {
        format!(
            "a view of {len} values needs {need} bytes; the buffer has {}",
            buf.len_bytes()
        )
    })
}

/// Root mean square, accumulated in f64; 0 for an empty slice.
pub(super) fn rms(values: &[f32]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    (values.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / values.len() as f64).sqrt()
}

/// The comparison itself: the largest error, the first value past its bound, and NaN refused.
fn compare(what: &str, got: &[f32], want: &[f32], allowed: impl Fn(usize, f32) -> f64) -> Check {
    if got.len() != want.len() {
        return Check::new(
            what,
            None,
            false,
            format!("{} values against {}", got.len(), want.len()),
        );
    }
    let mut max_error = 0.0f64;
    let mut first_bad: Option<(usize, f64)> = None;
    let mut beyond = 0usize;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        // The same infinity on both sides is no error (its difference would be NaN).
        let error = if g == w {
            0.0
        } else {
            (f64::from(g) - f64::from(w)).abs()
        };
        if error.is_nan() {
            return Check::new(
                what,
                None,
                false,
                format!("NaN at index {i}: got {g}, want {w}"),
            );
        }
        max_error = max_error.max(error);
        let bound = allowed(i, w);
        if error > bound {
            beyond += 1;
            first_bad.get_or_insert((i, bound));
        }
    }
    match first_bad {
        None => Check::new(
            what,
            Some(max_error),
            true,
            format!("max |diff| {max_error:.3e} over {} values", got.len()),
        ),
        Some((i, bound)) => Check::new(
            what,
            Some(max_error),
            false,
            format!(
                "{beyond} of {} values beyond the bound; first at {i}: got {}, want {}, \
                 allowed {bound:.3e}; max |diff| {max_error:.3e}",
                got.len(),
                got[i],
                want[i]
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comparison_reports_its_largest_error_and_the_first_value_past_the_bound() {
        let ok = compare("x", &[1.0, 2.05], &[1.0, 2.0], |_, _| 0.1);
        assert!(ok.passed, "{ok:?}");
        assert!((ok.max_error.unwrap() - 0.05).abs() < 1e-6);
        let bad = compare("x", &[1.5, 2.0, 9.0], &[1.0, 2.0, 3.0], |_, _| 0.1);
        assert!(!bad.passed);
        assert_eq!(bad.max_error, Some(6.0));
        assert!(
            bad.detail.starts_with("2 of 3") && bad.detail.contains("at 0"),
            "{bad:?}"
        );
    }

    #[test]
    fn nan_on_either_side_and_a_length_mismatch_fail() {
        for (got, want) in [
            (vec![f32::NAN], vec![1.0]),
            (vec![1.0], vec![f32::NAN]),
            (vec![f32::INFINITY], vec![f32::NEG_INFINITY]),
        ] {
            let c = compare("x", &got, &want, |_, _| 1e30);
            assert!(!c.passed, "{got:?} against {want:?} passed");
        }
        assert!(compare("x", &[f32::INFINITY], &[f32::INFINITY], |_, _| 0.0).passed);
        assert!(!compare("x", &[1.0], &[1.0, 2.0], |_, _| 1.0).passed);
    }

    #[test]
    fn the_rms_is_of_the_values_and_zero_for_none() {
        assert_eq!(rms(&[]), 0.0);
        assert!((rms(&[3.0, -4.0]) - (12.5f64).sqrt()).abs() < 1e-12);
    }
}
