//! The device copy of a step's paged-KV addressing: a sequence id per row of the step, then
//! every block table of the context (rocm-kernels' `KvPages`). `begin_step` writes the rows'
//! ids every step and the tables only when they changed, both from pinned staging with one
//! copy ordered on the stream, so a captured step replays over the same addresses.

use crate::backend::gpu::{error::gpu_err, DeviceTables, GpuBackend};
use crate::backend::{BlockTables, KvGroup};
use crate::error::{DecodeError, Result};
use hip_ffi::{DevicePtr, Event, PinnedHostBuffer};
use rocm_alloc::Tag;
use rocm_kernels::ops::kv_cache::KvPages;
use rocm_kernels::DeviceSlice;

/// The sequence id of a padding row on the device (`KV_PADDING_ROW` in kv_pages.h).
const PADDING_ROW: i32 = -1;

impl DeviceTables {
    /// The ids of a step's first `rows` rows (a view of `len` from row `start`).
    fn seqs(&self, start: usize, len: usize) -> Option<DeviceSlice<i32>> {
        self.all().slice(start, len)
    }

    fn all(&self) -> DeviceSlice<i32> {
        // SAFETY: the allocation holds `len` i32 and lives as long as `self`; kernels reading
        // it are queued on the backend's one stream, which also returns it to the allocator.
        unsafe { DeviceSlice::from_raw(self.ints.ptr(), self.len) }
    }
}

impl GpuBackend {
    /// Takes the block-table buffer for steps of up to `max_tokens` rows over tables of
    /// `table_entries` entries (the layout's `block_table_ints`), keeping a large enough one.
    pub(super) fn reserve_block_tables(
        &mut self,
        max_tokens: usize,
        table_entries: usize,
    ) -> Result<()> {
        let len = crate::layout::workspace::block_table_ints(max_tokens, table_entries)?.max(1);
        if self
            .tables
            .as_ref()
            .is_some_and(|t| t.len >= len && t.max_tokens >= max_tokens)
        {
            return Ok(());
        }
        // The old buffer goes back before the larger one is taken.
        self.tables = None;
        let ints = self
            .alloc
            .alloc((len * 4) as u64, self.stream_id, Tag::Workspace)
            .map_err(|e| DecodeError::Allocation {
                what: "the KV block tables".into(),
                reason: e.to_string(),
            })?;
        let device = *self.kernels.device();
        let staging = PinnedHostBuffer::alloc(&device, len * 4)
            .map_err(|e| gpu_err("pinned staging for the block tables", e))?;
        let copied = Event::new_without_timing(&device).map_err(|e| gpu_err("event", e))?;
        copied
            .record(&self.stream)
            .map_err(|e| gpu_err("recording an event", e))?;
        self.tables = Some(DeviceTables {
            ints,
            staging,
            copied,
            max_tokens,
            len,
            written: None,
            offsets: Vec::new(),
        });
        Ok(())
    }

    /// Writes the step's rows' sequence ids, and `tables` when they differ from the copy on
    /// the device, ordered on the stream before the step's kernels. The last `padding` rows
    /// (`StepBatch::padding`) get the id -1, whose keys and values the KV stores skip
    /// (kv_pages.h).
    pub(super) fn write_block_tables(
        &mut self,
        seqs: &[usize],
        padding: usize,
        tables: &BlockTables,
    ) -> Result<()> {
        let total = tables.total_entries();
        // A context reserves the buffer with its workspace; ops run on their own (tests) take
        // it here, before any kernel of the step.
        let rows = seqs.len().max(self.step.max_batch);
        if self
            .tables
            .as_ref()
            .is_none_or(|t| t.max_tokens < seqs.len() || t.max_tokens + total > t.len)
        {
            self.reserve_block_tables(rows, total)?;
        }
        let Some(t) = self.tables.as_mut() else {
            return Err(gpu_err("paged KV", "the block tables were not reserved"));
        };
        if seqs.len() > t.max_tokens || t.max_tokens + total > t.len {
            return Err(DecodeError::InvalidArgument(format!(
                "a step of {} rows over {total} table entries; the block tables were reserved \
                 for {} rows and {} entries",
                seqs.len(),
                t.max_tokens,
                t.len - t.max_tokens
            )));
        }
        t.copied
            .synchronize()
            .map_err(|e| gpu_err("waiting for the block-table copy", e))?;
        let staging = t.staging.as_mut_slice::<i32>();
        let real = seqs.len().saturating_sub(padding);
        for (row, (slot, &s)) in staging.iter_mut().zip(seqs).enumerate() {
            // Context::check_batch keeps sequence ids below the context's count.
            *slot = if row < real { s as i32 } else { PADDING_ROW };
        }
        let fresh = t.written.as_ref() != Some(tables);
        let mut end = seqs.len();
        if fresh {
            t.offsets.clear();
            let mut at = t.max_tokens;
            for g in tables.groups() {
                t.offsets.push(at);
                for (slot, &b) in staging[at..].iter_mut().zip(&g.entries) {
                    // An unassigned entry is never read (the context checks every row's
                    // block); the kernels clamp it regardless.
                    *slot = b as i32;
                }
                at += g.entries.len();
            }
            end = at;
            t.written = Some(tables.clone());
        }
        let src = &t.staging.as_slice::<i32>()[..end.max(1)];
        // SAFETY: the copy covers the first `end` i32 of the table buffer, which holds `len`
        // >= end; the staging buffer is pinned and not written again before `copied` completes.
        unsafe { self.stream.copy_from_host_raw(DevicePtr(t.ints.ptr()), src) }
            .and_then(|()| t.copied.record(&self.stream))
            .map_err(|e| gpu_err("writing the block tables", e))
    }

    /// The paging of `group` for the step's rows `start..start + rows`.
    pub(super) fn kv_pages(&self, group: KvGroup, start: usize, rows: usize) -> Result<KvPages> {
        let missing = || gpu_err("paged KV", "no block tables were written for this step");
        let t = self.tables.as_ref().ok_or_else(missing)?;
        let written = t.written.as_ref().ok_or_else(missing)?;
        let g = written.groups().get(group.0).ok_or_else(missing)?;
        let at = t.offsets[group.0];
        Ok(KvPages {
            seqs: t.seqs(start, rows).ok_or_else(missing)?,
            tables: t.all().slice(at, g.entries.len()).ok_or_else(missing)?,
            table_len: g.table_len,
            block: written.block(),
        })
    }
}
