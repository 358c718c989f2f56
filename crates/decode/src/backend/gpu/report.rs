//! What the device holds: the allocator's books and what the process holds outside them.

use crate::backend::gpu::{error::gpu_err, GpuBackend};
use crate::error::Result;
use crate::memory::DeviceMemory;
use rocm_alloc::fmt_bytes;

impl GpuBackend {
    pub(super) fn device_memory_now(&self) -> Result<DeviceMemory> {
        let stats = self.alloc.stats();
        let now = self
            .device()
            .mem_get_info()
            .map_err(|e| gpu_err("reading device memory", e))?;
        let process_used = self.mem_before.free.saturating_sub(now.free);
        let snap = self.alloc.snapshot();
        Ok(DeviceMemory {
            outside_allocator: process_used.saturating_sub(stats.reserved_bytes),
            process_used,
            stats,
            breakdown: snap.breakdown(),
            runtime_at_start: self.capture.runtime_at_start,
            graph: self.capture.books,
            per_process: self.device().process_memory().map(|p| p.bytes),
            stranded: snap
                .stranded_bytes_by_stream()
                .into_iter()
                .map(|(s, b)| (s.value(), b))
                .collect(),
        })
    }

    /// [`crate::backend::Backend::device_room`]: free device memory now and what the
    /// allocator's limit still allows.
    pub(super) fn device_room_now(&self) -> Result<crate::memory::DeviceRoom> {
        let info = self
            .device()
            .mem_get_info()
            .map_err(|e| gpu_err("reading device memory", e))?;
        let reserved = self.alloc.stats().reserved_bytes;
        Ok(crate::memory::DeviceRoom {
            free: info.free,
            allocator_headroom: self
                .alloc
                .memory_limit()
                .map(|l| l.saturating_sub(reserved)),
            total: info.total,
            host_weights: self.host_weights.pinned_bytes() > 0,
        })
    }

    /// The layout options of this backend's buffers for a context of `bounds`: its KV type,
    /// paths and step block as they are, the vendor GEMM's buffers where its library opened.
    pub fn layout_options(
        &self,
        bounds: &crate::context::ContextOptions,
    ) -> crate::layout::LayoutOptions {
        use crate::backend::gpu::offload::prefetch::HostPrefill;
        crate::layout::LayoutOptions {
            bounds: *bounds,
            target: crate::layout::Target::Gpu,
            kv_type: self.kv_type,
            int8_matvec: self.matvec_path == crate::backend::gpu::MatvecPath::Int8,
            int8_mma_rows: self.int8_mma_max_rows,
            vendor_gemm: self.vendor_gemm.is_some(),
            step_block_batch: self.step.max_batch,
            stream_prefill: self.host_prefill == HostPrefill::Stream,
            lookup_on_host: self.embed_table == crate::backend::gpu::EmbedTable::Host,
            kv_pool_grows: self.kv_pool == crate::backend::gpu::KvPool::Grow,
            // The backend does not know the model it will run; a caller laying out a rank
            // sets its shard.
            shard: crate::model::Shard::whole(),
        }
    }

    /// The memory report a user reads: per tag the bytes held, then the allocator's reserved,
    /// cached and peaks, and the device memory the process holds outside the allocator.
    pub(super) fn device_report_text(&self) -> Result<String> {
        let DeviceMemory {
            stats,
            process_used,
            outside_allocator,
            per_process,
            ..
        } = self.device_memory_now()?;
        let mut out = String::new();
        out.push_str(&format!("device memory ({}):\n", self.alloc.device_name()));
        for (tag, usage) in &stats.per_tag {
            if usage.current == 0 && usage.peak == 0 {
                continue;
            }
            out.push_str(&format!(
                "  {:<16} {:>12}   peak {:>12}\n",
                tag.name(),
                fmt_bytes(usage.current),
                fmt_bytes(usage.peak)
            ));
        }
        out.push_str(&format!(
            "  allocated {:>12}   peak {:>12}\n  reserved  {:>12}   peak {:>12}\n  cached    {:>12}\n",
            fmt_bytes(stats.active_bytes),
            fmt_bytes(stats.peak_active_bytes),
            fmt_bytes(stats.reserved_bytes),
            fmt_bytes(stats.peak_reserved_bytes),
            fmt_bytes(stats.cached_bytes),
        ));
        out.push_str(&format!(
            "  process device usage {} (free {} before load)\n  outside the allocator {} (kernel modules, graphs, runtime; the context predates the first reading)\n",
            fmt_bytes(process_used),
            fmt_bytes(self.mem_before.free),
            fmt_bytes(outside_allocator),
        ));
        let tool = match self.device().platform() {
            hip_ffi::PlatformKind::Amd => "rocm-smi",
            _ => "nvidia-smi",
        };
        out.push_str(&match per_process {
            Ok(bytes) => format!(
                "  as {tool} lists this process {} (of it {} before the first reading: context, \
                 runtime)\n",
                fmt_bytes(bytes),
                fmt_bytes(bytes.saturating_sub(process_used)),
            ),
            Err(why) => format!("  as {tool} lists this process: unknown ({why})\n"),
        });
        out.push_str(&self.host_weights.report_line());
        if let Some(line) = self.hybrid.report_line() {
            out.push_str(&line);
        }
        if let Some(p) = &self.prefetch {
            out.push_str(&format!("  {}\n", p.report_line()));
        }
        Ok(out)
    }
}
