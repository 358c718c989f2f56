//! The CPU backend: the reference every GPU kernel is checked against, the fallback without a
//! GPU, and the path CI runs. Buffers are heap vectors; weights are read in place from the
//! memory-mapped file in their stored format by the fused kernels in `super::kernels`.

pub mod kernels;
mod ops;

use super::{
    Attention, Backend, BlockTables, ExpertChoice, GateActivation, KvGroup, KvLayer, MoeShape,
    Rope, StepBatch, WeightSource,
};
use crate::error::{DecodeError, Result};
use crate::kv::KvType;
use crate::memory::{MemoryReport, MemoryTag};
use crate::quant::{self, Q16Row};
use gguf_loader::{GgmlType, GgufFile, TensorInfo};
use kernels::{MatrixRef, Precision};
use rocm_kernels::ops::rope::RopeShape;
use rocm_kernels::reference;
use std::sync::Arc;

/// A weight tensor held in host memory in its stored format.
pub struct CpuWeight {
    name: String,
    format: GgmlType,
    dims: [usize; 3],
    data: Bytes,
    /// One-dimensional tensors (norms, biases, rope factors) dequantized once.
    vector: Vec<f32>,
}

/// Where a weight's bytes are: read in place from the mapped file, or an owned copy.
enum Bytes {
    Mapped(Arc<GgufFile>, TensorInfo),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(file, info) => file.tensor_data(info),
            Bytes::Owned(v) => v,
        }
    }
}

impl CpuWeight {
    fn matrix(&self, index: usize) -> MatrixRef<'_> {
        let (cols, rows) = (self.dims[0], self.dims[1]);
        // Checked when loaded: whole blocks, and the product fits.
        let bytes = rows * quant::row_bytes(self.format, cols).unwrap_or(0);
        MatrixRef {
            format: self.format,
            data: &self.data.as_slice()[index * bytes..(index + 1) * bytes],
            rows,
            cols,
        }
    }

    fn vector(&self) -> Result<&[f32]> {
        if self.vector.is_empty() {
            return Err(DecodeError::InvalidArgument(format!(
                "tensor '{}' is used as a vector but has shape {:?}",
                self.name, self.dims
            )));
        }
        Ok(&self.vector)
    }
}

/// One sequence's rows in a step.
struct SeqSpan {
    seq: usize,
    first: usize,
    last: usize,
    rows: usize,
}

/// A zeroed buffer of `len` values: a fallible probe first, so an absurd size is an error and
/// not an abort; then `vec!`, which takes zeroed pages lazily where filling the probe would
/// touch every byte.
fn zeroed(tag: MemoryTag, len: usize) -> Result<Vec<f32>> {
    let failed = |reason: String| DecodeError::Allocation {
        what: format!("{len} f32 values of {}", tag.name()),
        reason,
    };
    let bytes = len
        .checked_mul(4)
        .ok_or_else(|| failed("the byte count overflows".into()))?;
    let mut probe: Vec<f32> = Vec::new();
    probe
        .try_reserve_exact(len)
        .map_err(|e| failed(format!("{bytes} bytes: {e}")))?;
    drop(probe);
    Ok(vec![0.0; len])
}

/// The CPU backend.
pub struct CpuBackend {
    precision: Precision,
    /// The KV cache's type: its values are rounded to it on store and kept in f32 rows.
    kv_type: KvType,
    books: MemoryReport,
    /// Buffers from `alloc_growable`, by address: their tag and the values committed (booked)
    /// so far. Their pages are the kernel's lazily zeroed ones, so the host takes them as
    /// they are written, much as a device maps a growing pool's pieces.
    growable: std::collections::HashMap<usize, (MemoryTag, usize)>,
    /// The current step's tokens (from `begin_step`).
    step_tokens: Vec<u32>,
    /// Each row's position and sequence.
    step_rows: Vec<(usize, usize)>,
    /// Rows of the step that are padding (`StepBatch::padding`): the last ones.
    step_padding: usize,
    /// Padding rows of every step so far.
    padding_rows_run: usize,
    /// Pad decode steps to the GPU's graph buckets (`CpuBackend::pad_decode_steps`).
    pad_decode_steps: bool,
    /// This rank's end of a tensor-parallel group (`CpuBackend::with_collective`).
    collective: Option<Box<dyn collective::Collective>>,
    /// Per sequence of the step: its first and last position in it (the ring checks).
    step_spans: Vec<SeqSpan>,
    /// The context's block tables as of `begin_step`.
    tables: Option<BlockTables>,
    /// The positions of the step's rows, as rocm-kernels' rope reference takes them (made once
    /// per step, not per layer).
    step_positions: Vec<i32>,
    act_q: Vec<Q16Row>,
    row: Vec<f32>,
}

impl CpuBackend {
    /// A backend using rayon's global pool (one thread per core unless `RAYON_NUM_THREADS`).
    pub fn new(precision: Precision) -> CpuBackend {
        CpuBackend {
            precision,
            kv_type: KvType::F32,
            books: MemoryReport {
                location: "host".into(),
                ..Default::default()
            },
            growable: Default::default(),
            act_q: Vec::new(),
            row: Vec::new(),
            step_tokens: Vec::new(),
            step_rows: Vec::new(),
            step_padding: 0,
            padding_rows_run: 0,
            pad_decode_steps: false,
            collective: None,
            step_spans: Vec::new(),
            tables: None,
            step_positions: Vec::new(),
        }
    }

    /// Has the model pad decode steps up to the GPU backend's graph buckets
    /// (`graph_rows::bucket`), as it does for a GPU that replays graphs, so that the padding's
    /// path (padding rows that store nothing, real rows' logits in place) runs where there is
    /// no GPU. Off by default: the CPU captures nothing, so padding only costs it.
    pub fn pad_decode_steps(&mut self, on: bool) {
        self.pad_decode_steps = on;
    }

    /// This backend as one rank of a tensor-parallel group: the all-reduces of a model split
    /// over the group's ranks (`Model::load_shard`) go through `collective`.
    pub fn with_collective(mut self, collective: Box<dyn collective::Collective>) -> CpuBackend {
        self.collective = Some(collective);
        self
    }

    /// Stops this rank's tensor-parallel group with `reason` (a failed call), so the other
    /// ranks return it rather than wait; nothing without a collective.
    pub fn abort_collective(&mut self, reason: &str) {
        if let Some(c) = self.collective.as_mut() {
            c.abort(reason);
        }
    }

    /// Padding rows of every step run so far.
    pub fn padding_rows_run(&self) -> usize {
        self.padding_rows_run
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Makes later contexts' KV caches of type `kv`: each stored row is rounded as the GPU's
    /// store kernel rounds it (bit for bit), and kept in f32, so attention here reads the
    /// numbers a GPU cache of that type holds. Memory is f32's whatever the type.
    pub fn set_kv_type(&mut self, kv: KvType) {
        self.kv_type = kv;
    }
}

impl CpuBackend {
    /// The tables `begin_step` took.
    fn step_tables(&self) -> Result<&BlockTables> {
        self.tables.as_ref().ok_or_else(|| {
            DecodeError::InvalidArgument("a KV op before any step began (begin_step)".into())
        })
    }
}

/// A row whose position has no block in the caches.
fn unmapped(seq: usize, pos: usize) -> DecodeError {
    DecodeError::InvalidArgument(format!(
        "sequence {seq}'s position {pos} has no KV block in the cache"
    ))
}

/// A shape rocm-kernels' CPU reference refused (the checks above normally catch it first).
fn reference_err(e: rocm_kernels::KernelError) -> DecodeError {
    DecodeError::InvalidArgument(e.to_string())
}

fn check_len(what: &str, have: usize, need: usize) -> Result<()> {
    if have < need {
        return Err(DecodeError::InvalidArgument(format!(
            "{what}: buffer holds {have} values but the op needs {need}"
        )));
    }
    Ok(())
}

impl Backend for CpuBackend {
    type Buffer = Vec<f32>;
    type Weight = CpuWeight;

    fn describe(&self) -> String {
        let mode = match self.precision {
            Precision::Fast => "16-bit integer activations",
            Precision::Exact => "f32 activations",
        };
        format!(
            "cpu ({} threads, {mode}, {} KV)",
            rayon::current_num_threads(),
            self.kv_type
        )
    }

    fn kv_type(&self) -> KvType {
        self.kv_type
    }

    fn kv_storage(&self) -> KvType {
        KvType::F32
    }

    fn kv_room(&self) -> Option<(u64, String)> {
        let available = crate::memory::host_available()?;
        Some((
            available,
            "available on the host (MemAvailable)".to_string(),
        ))
    }

    fn alloc(&mut self, tag: MemoryTag, len: usize) -> Result<Vec<f32>> {
        let buffer = zeroed(tag, len)?;
        self.books.add(tag, len as u64 * 4);
        Ok(buffer)
    }

    fn alloc_growable(&mut self, tag: MemoryTag, len: usize) -> Result<Vec<f32>> {
        // Booked as it is committed.
        let buffer = zeroed(tag, len)?;
        self.growable.insert(buffer.as_ptr() as usize, (tag, 0));
        Ok(buffer)
    }

    fn commit(&mut self, buffer: &mut Vec<f32>, len: usize) -> Result<()> {
        let len = len.min(buffer.len());
        if let Some((tag, committed)) = self.growable.get_mut(&(buffer.as_ptr() as usize)) {
            if len > *committed {
                self.books.add(*tag, (len - *committed) as u64 * 4);
                *committed = len;
            }
        }
        Ok(())
    }

    fn release_beyond(&mut self, buffer: &mut Vec<f32>, len: usize) -> Result<()> {
        if let Some((tag, committed)) = self.growable.get_mut(&(buffer.as_ptr() as usize)) {
            if len < *committed {
                self.books.remove(*tag, (*committed - len) as u64 * 4);
                // What a commit backs again reads as zeros, as new device pieces do.
                buffer[len..*committed].fill(0.0);
                *committed = len;
            }
        }
        Ok(())
    }

    fn load_weight(&mut self, src: &WeightSource<'_>) -> Result<CpuWeight> {
        src.check_bytes()?;
        let [cols, rows, mats] = src.dims;
        let vector = if rows == 1 && mats == 1 {
            let mut v = vec![0.0; cols];
            quant::row_to_f32(src.format, src.bytes, &mut v);
            v
        } else {
            Vec::new()
        };
        self.books.add(
            MemoryTag::Weights,
            (src.bytes.len() + vector.len() * 4) as u64,
        );
        Ok(CpuWeight {
            name: src.name.to_string(),
            format: src.format,
            dims: src.dims,
            data: match src.mapped {
                Some(m) => Bytes::Mapped(Arc::clone(m.file), m.info.clone()),
                None => Bytes::Owned(src.bytes.to_vec()),
            },
            vector,
        })
    }

    fn memory(&self) -> MemoryReport {
        let mut r = self.books.clone();
        let scratch = self
            .act_q
            .iter()
            .map(|q| 2 * q.q.len() + 4 * (q.d.len() + q.group_sum.len()));
        r.add(
            MemoryTag::Workspace,
            (scratch.sum::<usize>() + self.row.len() * 4) as u64,
        );
        r
    }

    fn read(&mut self, src: &Vec<f32>, offset: usize, dst: &mut [f32]) -> Result<()> {
        check_len("read", src.len(), offset + dst.len())?;
        dst.copy_from_slice(&src[offset..offset + dst.len()]);
        Ok(())
    }

    fn host_values<'a>(&'a self, src: &'a Vec<f32>) -> Option<&'a [f32]> {
        Some(src)
    }

    fn write(&mut self, dst: &mut Vec<f32>, offset: usize, src: &[f32]) -> Result<()> {
        check_len("write", dst.len(), offset.saturating_add(src.len()))?;
        dst[offset..offset + src.len()].copy_from_slice(src);
        Ok(())
    }

    fn all_reduce_sum(&mut self, x: &mut Vec<f32>, len: usize) -> Result<()> {
        check_len("all_reduce_sum", x.len(), len)?;
        let Some(c) = self.collective.as_mut() else {
            return Err(crate::backend::no_collective());
        };
        c.all_reduce_sum(&mut x[..len])?;
        Ok(())
    }

    fn all_gather_cols(&mut self, x: &mut Vec<f32>, rows: usize, cols: usize) -> Result<()> {
        let Some(c) = self.collective.as_mut() else {
            return Err(crate::backend::no_collective());
        };
        crate::backend::gather_cols_on_host(c.as_mut(), x, rows, cols)
    }

    fn bucket_rows(&self, key: crate::backend::StepKey) -> usize {
        match self.pad_decode_steps && key.phase == crate::batch::Phase::Decode {
            true => crate::backend::gpu::graph_rows::bucket(key.n_tokens),
            false => key.n_tokens,
        }
    }

    fn begin_step(&mut self, batch: &StepBatch, tables: &BlockTables) -> Result<()> {
        // Compared with the copy held, since two contexts may share a backend.
        if self.tables.as_ref() != Some(tables) {
            self.tables = Some(tables.clone());
        }
        self.step_tokens.clear();
        self.step_tokens.extend_from_slice(batch.tokens());
        self.step_positions.clear();
        self.step_rows.clear();
        self.step_spans.clear();
        self.step_padding = batch.padding();
        self.padding_rows_run += batch.padding();
        let real = batch.len() - batch.padding();
        for (&pos, &seq) in batch.positions().iter().zip(batch.sequences()) {
            // The rope reference takes i32 positions.
            let Ok(p) = i32::try_from(pos) else {
                return Err(DecodeError::InvalidArgument(format!(
                    "a row at position {pos} passes the largest position, {}",
                    i32::MAX
                )));
            };
            self.step_positions.push(p);
            self.step_rows.push((pos, seq));
            if self.step_rows.len() > real {
                // A padding row: its position-0 reads stay in its sequence's first block,
                // which the sequence's real row of the step holds.
                continue;
            }
            match self.step_spans.iter_mut().find(|s| s.seq == seq) {
                Some(span) => {
                    span.first = span.first.min(pos);
                    span.last = span.last.max(pos);
                    span.rows += 1;
                }
                None => self.step_spans.push(SeqSpan {
                    seq,
                    first: pos,
                    last: pos,
                    rows: 1,
                }),
            }
        }
        Ok(())
    }

    fn embed(
        &mut self,
        table: &CpuWeight,
        n_tokens: usize,
        scale: f32,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let m = table.matrix(0);
        check_len("embed tokens", self.step_tokens.len(), n_tokens)?;
        let tokens = &self.step_tokens[..n_tokens];
        check_len("embed", out.len(), tokens.len() * m.cols)?;
        let rb = quant::row_bytes(m.format, m.cols).unwrap_or(0);
        for (t, &id) in tokens.iter().enumerate() {
            if id as usize >= m.rows {
                return Err(DecodeError::TokenOutOfRange { id, vocab: m.rows });
            }
            let dst = &mut out[t * m.cols..(t + 1) * m.cols];
            quant::row_to_f32(m.format, &m.data[id as usize * rb..][..rb], dst);
            if scale != 1.0 {
                dst.iter_mut().for_each(|v| *v *= scale);
            }
        }
        Ok(())
    }

    fn rms_norm(
        &mut self,
        x: &Vec<f32>,
        weight: &CpuWeight,
        out: &mut Vec<f32>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let w = weight.vector()?;
        check_len("rms_norm weight", w.len(), dim)?;
        check_len("rms_norm input", x.len(), rows * dim)?;
        check_len("rms_norm output", out.len(), rows * dim)?;
        let n = rows * dim;
        reference::norm::rms_norm(&x[..n], w, &mut out[..n], rows, dim, eps).map_err(reference_err)
    }

    fn rms_norm_inplace(
        &mut self,
        x: &mut Vec<f32>,
        weight: &CpuWeight,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let w = weight.vector()?;
        check_len("rms_norm weight", w.len(), dim)?;
        check_len("rms_norm input", x.len(), rows * dim)?;
        self.row.resize(dim, 0.0);
        // Row by row through the kept row buffer, so the norm takes no memory the books do
        // not show.
        for xr in x.chunks_exact_mut(dim).take(rows) {
            self.row.copy_from_slice(xr);
            reference::norm::rms_norm(&self.row, w, xr, 1, dim, eps).map_err(reference_err)?;
        }
        Ok(())
    }

    fn matmul(
        &mut self,
        w: &CpuWeight,
        x: &Vec<f32>,
        out: &mut Vec<f32>,
        rows: usize,
    ) -> Result<()> {
        let m = w.matrix(0);
        check_len("matmul input", x.len(), rows * m.cols)?;
        check_len("matmul output", out.len(), rows * m.rows)?;
        kernels::matmul(
            m,
            &x[..rows * m.cols],
            rows,
            &mut out[..rows * m.rows],
            self.precision,
            &mut self.act_q,
        );
        Ok(())
    }

    fn moe(
        &mut self,
        x: &Vec<f32>,
        router_logits: &Vec<f32>,
        gate: &CpuWeight,
        up: &CpuWeight,
        down: &CpuWeight,
        out: &mut Vec<f32>,
        shape: &MoeShape,
    ) -> Result<()> {
        let routes = self.route_top_k(router_logits, shape.rows, shape.n_expert, shape.k)?;
        let e = shape.n_embd;
        check_len("moe output", out.len(), shape.rows * e)?;
        out[..shape.rows * e].fill(0.0);
        let mut g = vec![0.0; shape.n_ff];
        let mut u = vec![0.0; shape.n_ff];
        let mut y = vec![0.0; e];
        for (t, choices) in routes.iter().enumerate() {
            for c in choices {
                self.matmul_expert(gate, c.expert, x, t, &mut g)?;
                self.matmul_expert(up, c.expert, x, t, &mut u)?;
                reference::elementwise::gated(&mut g, &u, shape.n_ff, shape.act)
                    .map_err(reference_err)?;
                self.matmul_expert(down, c.expert, &g, 0, &mut y)?;
                self.add_scaled_row(out, t, &y, e, c.weight)?;
            }
        }
        Ok(())
    }

    fn add_bias(&mut self, x: &mut Vec<f32>, bias: &CpuWeight, rows: usize) -> Result<()> {
        let b = bias.vector()?;
        check_len("add_bias", x.len(), rows * b.len())?;
        for xr in x.chunks_exact_mut(b.len()).take(rows) {
            for (v, &bv) in xr.iter_mut().zip(b) {
                *v += bv;
            }
        }
        Ok(())
    }

    fn rope(
        &mut self,
        x: &mut Vec<f32>,
        rows: usize,
        n_heads: usize,
        head_dim: usize,
        rope: &Rope,
        freq_factors: Option<&CpuWeight>,
    ) -> Result<()> {
        check_len("rope", x.len(), rows * n_heads * head_dim)?;
        let factors = freq_factors.map(|f| f.vector()).transpose()?;
        if let Some(f) = factors {
            check_len("rope frequency factors", f.len(), rope.n_rot / 2)?;
        }
        check_len("rope positions", self.step_positions.len(), rows)?;
        let positions = &self.step_positions[..rows];
        let shape = RopeShape {
            rows,
            n_heads,
            head_dim,
        };
        let n = rows * n_heads * head_dim;
        reference::rope::rope(&mut x[..n], positions, factors, shape, rope).map_err(reference_err)
    }

    fn store_rows(
        &mut self,
        src: &Vec<f32>,
        cache: &mut Vec<f32>,
        rows: usize,
        dim: usize,
        layer: KvLayer,
    ) -> Result<()> {
        let slots = layer.slots;
        check_len("store_rows source", src.len(), rows * dim)?;
        check_len("store_rows rows", self.step_rows.len(), rows)?;
        for span in &self.step_spans {
            if span.rows > slots {
                return Err(DecodeError::ContextFull {
                    needed: span.rows,
                    capacity: slots,
                });
            }
        }
        let kv_type = self.kv_type;
        if !dim.is_multiple_of(kv_type.block_values()) {
            return Err(DecodeError::InvalidArgument(format!(
                "{kv_type} KV rows of {dim} values are not whole blocks"
            )));
        }
        let tables = self.step_tables()?;
        let cache_rows = cache.len() / dim.max(1);
        let real = self.step_rows.len() - self.step_padding;
        for (row, &(pos, seq)) in src
            .chunks_exact(dim)
            .zip(&self.step_rows)
            .take(rows.min(real))
        {
            let slot = pos % slots;
            let at = tables
                .row(layer.group, seq, slot)
                .filter(|&r| r < cache_rows)
                .ok_or_else(|| unmapped(seq, pos))?;
            let stored = &mut cache[at * dim..(at + 1) * dim];
            stored.copy_from_slice(row);
            // Rows are whole blocks: the context checked the head sizes.
            kv_type.round(stored);
        }
        Ok(())
    }

    fn copy_blocks(
        &mut self,
        cache: &mut Vec<f32>,
        copies: &[(usize, usize)],
        block_values: usize,
    ) -> Result<()> {
        for &(from, to) in copies {
            let end = from.max(to).saturating_add(1).saturating_mul(block_values);
            check_len("copy_blocks cache", cache.len(), end)?;
            cache.copy_within(
                from * block_values..(from + 1) * block_values,
                to * block_values,
            );
        }
        Ok(())
    }

    fn attention(
        &mut self,
        q: &Vec<f32>,
        k_cache: &Vec<f32>,
        v_cache: &Vec<f32>,
        out: &mut Vec<f32>,
        a: &Attention,
        group: KvGroup,
    ) -> Result<()> {
        if a.n_head_kv == 0 || !a.n_head.is_multiple_of(a.n_head_kv) {
            return Err(DecodeError::InvalidArgument(format!(
                "{} query heads cannot share {} KV heads",
                a.n_head, a.n_head_kv
            )));
        }
        check_len("attention rows", self.step_rows.len(), a.n_tokens)?;
        let k_stride = a.n_head_kv * a.head_dim_k;
        let v_stride = a.n_head_kv * a.head_dim_v;
        for span in &self.step_spans {
            // The oldest key the sequence's first row reads must still be in its ring after
            // its last row's key is stored.
            let oldest = match a.window {
                Some(w) => (span.first + 1).saturating_sub(w),
                None => 0,
            };
            let end = span.last + 1;
            if a.slots == 0 || end - oldest > a.slots {
                return Err(DecodeError::InvalidArgument(format!(
                    "attention over positions {oldest}..{end} needs {} cache slots but has {}",
                    end - oldest,
                    a.slots
                )));
            }
        }
        let tables = self.step_tables()?;
        let block = tables.block();
        let g = tables.group(group);
        if a.slots > g.slots {
            return Err(DecodeError::InvalidArgument(format!(
                "attention over {} slots through tables of {}",
                a.slots, g.slots
            )));
        }
        // Every block a row of the step reads is in both caches.
        let cache_rows = (k_cache.len() / k_stride.max(1)).min(v_cache.len() / v_stride.max(1));
        for span in &self.step_spans {
            let blocks = (span.last + 1).min(a.slots).div_ceil(block);
            let table = g.table(span.seq);
            if table[..blocks]
                .iter()
                .any(|&b| b as usize >= cache_rows / block)
            {
                return Err(unmapped(span.seq, span.last));
            }
        }
        check_len("attention q", q.len(), a.n_tokens * a.n_head * a.head_dim_k)?;
        check_len(
            "attention out",
            out.len(),
            a.n_tokens * a.n_head * a.head_dim_v,
        )?;
        let rows: Vec<(usize, &[u32])> = self.step_rows[..a.n_tokens]
            .iter()
            .map(|&(pos, seq)| (pos, g.table(seq)))
            .collect();
        ops::attention(q, k_cache, v_cache, out, a, &rows, block);
        Ok(())
    }

    fn gated(
        &mut self,
        gate: &mut Vec<f32>,
        up: &Vec<f32>,
        len: usize,
        act: GateActivation,
    ) -> Result<()> {
        check_len("gate", gate.len(), len)?;
        check_len("up", up.len(), len)?;
        reference::elementwise::gated(gate, up, len, act).map_err(reference_err)
    }

    fn add(&mut self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) -> Result<()> {
        check_len("add", x.len().min(y.len()), len)?;
        for (a, &b) in x[..len].iter_mut().zip(&y[..len]) {
            *a += b;
        }
        Ok(())
    }

    fn softcap(&mut self, x: &mut Vec<f32>, len: usize, cap: f32) -> Result<()> {
        check_len("softcap", x.len(), len)?;
        for v in &mut x[..len] {
            *v = rocm_kernels::reference::elementwise::softcap_logit(*v, cap);
        }
        Ok(())
    }

    fn copy_row(
        &mut self,
        src: &Vec<f32>,
        src_row: usize,
        dst: &mut Vec<f32>,
        dst_row: usize,
        dim: usize,
    ) -> Result<()> {
        check_len("copy_row source", src.len(), (src_row + 1) * dim)?;
        check_len("copy_row destination", dst.len(), (dst_row + 1) * dim)?;
        dst[dst_row * dim..(dst_row + 1) * dim]
            .copy_from_slice(&src[src_row * dim..(src_row + 1) * dim]);
        Ok(())
    }

    fn zero(&mut self, x: &mut Vec<f32>, len: usize) -> Result<()> {
        check_len("zero", x.len(), len)?;
        x[..len].fill(0.0);
        Ok(())
    }

    fn argmax(&mut self, x: &Vec<f32>, row: usize, n: usize) -> Result<u32> {
        check_len("argmax", x.len(), (row + 1) * n)?;
        Ok(rocm_kernels::reference::sampling::argmax(&x[row * n..(row + 1) * n]) as u32)
    }
}

/// The CPU's MoE pieces: routing to the host, then one expert matrix at a time.
impl CpuBackend {
    fn matmul_expert(
        &mut self,
        w: &CpuWeight,
        expert: usize,
        x: &[f32],
        x_row: usize,
        out: &mut [f32],
    ) -> Result<()> {
        if expert >= w.dims[2] {
            return Err(DecodeError::InvalidArgument(format!(
                "expert {expert} of '{}' which has {}",
                w.name, w.dims[2]
            )));
        }
        let m = w.matrix(expert);
        check_len("expert input", x.len(), (x_row + 1) * m.cols)?;
        check_len("expert output", out.len(), m.rows)?;
        kernels::matmul(
            m,
            &x[x_row * m.cols..(x_row + 1) * m.cols],
            1,
            &mut out[..m.rows],
            self.precision,
            &mut self.act_q,
        );
        Ok(())
    }

    fn add_scaled_row(
        &mut self,
        x: &mut [f32],
        x_row: usize,
        y: &[f32],
        dim: usize,
        alpha: f32,
    ) -> Result<()> {
        check_len("add_scaled_row", x.len(), (x_row + 1) * dim)?;
        check_len("add_scaled_row source", y.len(), dim)?;
        for (a, &b) in x[x_row * dim..(x_row + 1) * dim].iter_mut().zip(&y[..dim]) {
            *a += alpha * b;
        }
        Ok(())
    }

    fn route_top_k(
        &mut self,
        logits: &[f32],
        rows: usize,
        n_expert: usize,
        k: usize,
    ) -> Result<Vec<Vec<ExpertChoice>>> {
        if k == 0 || k > n_expert {
            return Err(DecodeError::InvalidArgument(format!(
                "cannot route to {k} of {n_expert} experts"
            )));
        }
        check_len("route_top_k", logits.len(), rows * n_expert)?;
        Ok(logits
            .chunks_exact(n_expert)
            .take(rows)
            .map(|row| {
                let mut idx: Vec<usize> = (0..n_expert).collect();
                // Stable sort keeps the lower index first on ties, like a plain argmax.
                idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
                let mut top: Vec<f32> = idx[..k].iter().map(|&i| row[i]).collect();
                ops::softmax(&mut top);
                idx[..k]
                    .iter()
                    .zip(top)
                    .map(|(&expert, weight)| ExpertChoice { expert, weight })
                    .collect()
            })
            .collect())
    }
}
