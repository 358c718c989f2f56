//! The device-side step block: the positions and token ids every kernel of a step reads, and
//! the token a step picks.

use crate::backend::gpu::{error::gpu_err, GpuBackend, StepBlock};
use crate::error::{DecodeError, Result};
use hip_ffi::DevicePtr;
use rocm_kernels::{DeviceSlice, DeviceSliceMut};

impl StepBlock {
    pub(super) fn positions(&self) -> DeviceSlice<i32> {
        // SAFETY: `ints` holds `ints_len(max_batch)` i32 and lives as long as the backend.
        unsafe { DeviceSlice::from_raw(self.ints.ptr(), self.max_batch) }
    }
    pub(super) fn tokens(&self) -> DeviceSlice<i32> {
        // SAFETY: as above; the tokens follow the positions.
        unsafe {
            DeviceSlice::from_raw(self.ints.ptr() + 4 * self.max_batch as u64, self.max_batch)
        }
    }
    /// The first next-token slot: where the one-row argmax and the sampler write.
    pub(super) fn next_token(&self) -> DeviceSliceMut<i32> {
        // SAFETY: as above; the first of the max_batch (>= 1) i32 after the tokens.
        unsafe { DeviceSliceMut::from_raw(self.ints.ptr() + 8 * self.max_batch as u64, 1) }
    }

    /// The first `n` next-token slots, one per row of a batched argmax; an error past the
    /// `max_batch` the block holds.
    pub(super) fn next_tokens(&self, n: usize) -> Result<DeviceSliceMut<i32>> {
        if n > self.max_batch {
            return Err(DecodeError::InvalidArgument(format!(
                "a next token for each of {n} rows: the step block holds {}",
                self.max_batch
            )));
        }
        // SAFETY: as above; n <= max_batch of the max_batch i32 after the tokens.
        Ok(unsafe { DeviceSliceMut::from_raw(self.ints.ptr() + 8 * self.max_batch as u64, n) })
    }

    /// i32 values in the block for steps of up to `max_batch` tokens (the layout's rule).
    pub(super) fn ints_len(max_batch: usize) -> usize {
        crate::layout::workspace::step_block_ints(max_batch)
    }
}

impl GpuBackend {
    pub(super) fn step_ints_mut(&self, len: usize) -> DeviceSliceMut<i32> {
        // SAFETY: the step block holds `ints_len(max_batch)` i32 and lives as long as `self`.
        unsafe { DeviceSliceMut::from_raw(self.step.ints.ptr(), len) }
    }

    /// Writes the step's rows' positions and token ids into the step block with one copy,
    /// ordered on the stream.
    pub(super) fn write_step(&mut self, positions: &[usize], tokens: &[u32]) -> Result<()> {
        let (n, max) = (tokens.len(), self.step.max_batch);
        if n > max || positions.len() != n {
            return Err(DecodeError::InvalidArgument(format!(
                "a step of {n} tokens is more than the {max} the GPU backend was sized for"
            )));
        }
        if let Some(&last) = positions.iter().find(|&&p| i32::try_from(p).is_err()) {
            return Err(DecodeError::InvalidArgument(format!(
                "position {last} does not fit the step block's i32"
            )));
        }
        // The previous copy out of the staging buffer must be done before it is overwritten.
        self.step
            .copied
            .synchronize()
            .map_err(|e| gpu_err("waiting for the step copy", e))?;
        let staging = self.step.staging.as_mut_slice::<i32>();
        for (slot, &p) in staging[..n].iter_mut().zip(positions) {
            // Checked above to fit.
            *slot = p as i32;
        }
        for (slot, &t) in staging[max..max + n].iter_mut().zip(tokens) {
            *slot = t as i32;
        }
        let src = &self.step.staging.as_slice::<i32>()[..max + n];
        // SAFETY: the copy covers the positions and tokens of the step block (2 * max_batch
        // i32, of which max + n are written); the staging buffer is pinned and not written
        // again before `copied` completes.
        unsafe {
            self.stream
                .copy_from_host_raw(DevicePtr(self.step.ints.ptr()), src)
        }
        .and_then(|()| self.step.copied.record(&self.stream))
        .map_err(|e| gpu_err("writing the step block", e))
    }

    /// The next token as written on the device by [`GpuBackend::argmax_to_step`].
    pub fn read_next_token(&self) -> Result<u32> {
        let id = self.read_i32(self.step.next_token().addr())?;
        token_id(id)
    }

    /// The first `n` next tokens, as written on the device by [`GpuBackend::argmax_rows_to_step`],
    /// with one copy.
    pub fn read_next_tokens(&self, n: usize) -> Result<Vec<u32>> {
        let slots = self.step.next_tokens(n)?;
        let mut ids = vec![0i32; n];
        if n > 0 {
            self.read_i32s(slots.addr(), &mut ids)?;
        }
        ids.into_iter().map(token_id).collect()
    }
}

fn token_id(id: i32) -> Result<u32> {
    u32::try_from(id).map_err(|_| gpu_err("argmax", format!("negative token id {id}")))
}
