//! A context: the KV cache and activation buffers for a set of sequences over one shared
//! [`Model`], and each sequence's length and sampler.
//!
//! The model's weights are read-only once loaded, so any number of contexts may run over one
//! model; a context's buffers are sized at creation for its bounds (positions per sequence,
//! rows per step, sequences) and never move, which lets a GPU backend replay captured steps
//! over them. [`Model::step`] runs a [`crate::batch::StepBatch`] through a context.

mod kv_cache;

pub use kv_cache::KvCache;

use crate::backend::Backend;
use crate::batch::SeqId;
use crate::error::{DecodeError, Result};
use crate::layout::context::{self as layout, Activation as Act};
use crate::memory::MemoryTag;
use crate::model::Model;
use crate::sampler::{Sampler, SamplerConfig};

/// The bounds a context is created for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextOptions {
    /// Positions each sequence's KV cache holds (clamped to the model's trained context).
    pub context: usize,
    /// Most rows one step carries (the prefill chunk, or the decode rows of every sequence).
    pub max_batch: usize,
    /// Keep logits for every row of a step, not just the rows that ask (reference checks).
    pub all_logits: bool,
    /// Sequences the context holds at once.
    pub sequences: usize,
    /// Blocks of [`crate::kv::block_positions`] positions in the pool of the full-context
    /// layers' KV storage. `None`: every sequence's whole context, each sequence given its
    /// blocks at creation. With fewer, no sequence holds a block until the caller hands it
    /// blocks with [`Context::set_blocks`] (what a scheduler over a [`crate::kv::BlockPool`]
    /// of that many blocks does).
    pub kv_blocks: Option<usize>,
}

impl Default for ContextOptions {
    fn default() -> Self {
        ContextOptions {
            context: 4096,
            max_batch: 64,
            all_logits: false,
            sequences: 1,
            kv_blocks: None,
        }
    }
}

/// Per-step activation buffers, allocated once at the largest batch so their addresses never
/// change between steps.
pub(crate) struct Activations<B: Backend> {
    pub(crate) x: B::Buffer,
    pub(crate) xn: B::Buffer,
    pub(crate) q: B::Buffer,
    pub(crate) k: B::Buffer,
    pub(crate) v: B::Buffer,
    pub(crate) attn: B::Buffer,
    pub(crate) proj: B::Buffer,
    pub(crate) gate: B::Buffer,
    pub(crate) up: B::Buffer,
    pub(crate) router: B::Buffer,
    pub(crate) logits: B::Buffer,
}

impl<B: Backend> Activations<B> {
    fn get(&self, which: Act) -> &B::Buffer {
        match which {
            Act::Residual => &self.x,
            Act::Normalized => &self.xn,
            Act::Query => &self.q,
            Act::Key => &self.k,
            Act::Value => &self.v,
            Act::Attention => &self.attn,
            Act::Projection => &self.proj,
            Act::FfnGate => &self.gate,
            Act::FfnUp => &self.up,
            Act::Router => &self.router,
            Act::Logits => &self.logits,
        }
    }
}

/// One sequence's state in its context.
#[derive(Default)]
struct Sequence {
    /// Positions filled.
    len: usize,
    /// The sampler of its [`crate::batch::RowOutput::Sample`] rows, made from the first such
    /// row's settings and seed and kept while they stay the same.
    sampler: Option<Sampler>,
    /// Its last tokens (at most [`crate::sampler::MAX_REPEAT_LAST_N`]) with their positions,
    /// oldest first: what the sampler's penalties look back over.
    recent: std::collections::VecDeque<(usize, u32)>,
}

impl Sequence {
    fn remember(&mut self, pos: usize, token: u32) {
        if self.recent.len() == crate::sampler::MAX_REPEAT_LAST_N {
            self.recent.pop_front();
        }
        self.recent.push_back((pos, token));
    }
}

/// A token drawn for a row that asked for one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampled {
    /// The row's index in its step.
    pub row: usize,
    pub seq: SeqId,
    pub token: u32,
}

/// What a step gave each row that asked for a token: the token, or the error that ended its
/// sequence.
pub struct StepResults {
    /// The rows that got a token, in row order.
    pub sampled: Vec<Sampled>,
    /// The rows whose logits were not NaN- and infinity-free, each with its error
    /// ([`DecodeError::NonFiniteLogits`]); their sequences are cleared, so their requests
    /// end.
    pub failed: Vec<(usize, DecodeError)>,
}

/// The KV cache, activations and sequence table of a set of sequences.
pub struct Context<B: Backend> {
    pub(crate) kv: KvCache<B>,
    pub(crate) act: Activations<B>,
    options: ContextOptions,
    sequences: Vec<Sequence>,
    /// Rows of the logits buffer, and values per row.
    logit_rows: usize,
    /// Bytes its KV cache took in the backend's books.
    kv_bytes: u64,
    /// Values per key row and per value row.
    kv_dims: (usize, usize),
    vocab: usize,
    /// The last step's rows that have logits, in the logits buffer's order.
    pub(crate) outputs: Vec<(usize, SeqId)>,
}

impl<B: Backend> Context<B> {
    /// Allocates the KV cache and activations for `options` on `backend`, which must be the
    /// backend `model` was loaded on, and takes the backend's per-step workspace for them.
    pub fn new(model: &Model<B>, backend: &mut B, options: ContextOptions) -> Result<Context<B>> {
        let s = model.spec();
        if options.max_batch == 0 || options.context == 0 || options.sequences == 0 {
            return Err(DecodeError::InvalidArgument(
                "context, batch size and sequence count must be at least 1".into(),
            ));
        }
        let (kd, vd) = (s.widths.k, s.widths.v);
        check_kv_type(s, backend.kv_type())?;
        // The sizes are the layout's (`crate::layout::context`), which `ModelLayout` lists.
        let context = layout::clamp_context(s, options.context);
        let mb = options.max_batch;
        let plan = layout::kv_plan(
            s,
            context,
            mb,
            options.sequences,
            crate::kv::block_positions(),
            options.kv_blocks,
        )?;
        if plan.pool_blocks == 0 {
            return Err(DecodeError::InvalidArgument(
                "a KV pool of 0 blocks holds nothing: give at least one block".into(),
            ));
        }
        // A cache that cannot fit is refused before anything is allocated (on the host an
        // allocation that large would be taken lazily and end in the OOM killer).
        let kv_need = plan.total_bytes((kd, vd), backend.kv_storage())?;
        if let Some((room, what)) = backend.kv_room().filter(|&(room, _)| kv_need > room) {
            let fits = (room as u128 * context as u128 / kv_need.max(1) as u128) as usize;
            return Err(DecodeError::InvalidArgument(format!(
                "a context of {context} positions needs {} of KV cache, more than the {} {what}; \
                 give a smaller --ctx (about {fits} positions fit)",
                crate::memory::human_bytes(kv_need),
                crate::memory::human_bytes(room)
            )));
        }
        let kv_before = backend.memory().get(MemoryTag::KvCache);
        let kv = KvCache::new(backend, plan, context, (kd, vd))?;
        // A growing pool books its bytes as it grows; its size is the whole cache's.
        let kv_bytes = if kv.grows() {
            kv_need
        } else {
            backend
                .memory()
                .get(MemoryTag::KvCache)
                .saturating_sub(kv_before)
        };
        let sizes = layout::activations(s, mb, options.sequences, options.all_logits)?;
        let logit_rows = sizes.logit_rows();
        let mut a = |which| backend.alloc(MemoryTag::Activations, sizes.values(which));
        let act = Activations {
            x: a(Act::Residual)?,
            xn: a(Act::Normalized)?,
            q: a(Act::Query)?,
            k: a(Act::Key)?,
            v: a(Act::Value)?,
            attn: a(Act::Attention)?,
            proj: a(Act::Projection)?,
            gate: a(Act::FfnGate)?,
            up: a(Act::FfnUp)?,
            router: a(Act::Router)?,
            logits: a(Act::Logits)?,
        };
        let bounds = layout::step_bounds(s, kv.plan(), mb);
        // The buffers matrix products read, as the layout lists them.
        let matmul_inputs: Vec<_> = (sizes.matmul_inputs.iter())
            .map(|&(which, width)| (act.get(which), width))
            .collect();
        backend.reserve_workspace(&bounds, &matmul_inputs)?;
        Ok(Context {
            kv,
            act,
            options: ContextOptions { context, ..options },
            sequences: (0..options.sequences)
                .map(|_| Sequence::default())
                .collect(),
            logit_rows,
            kv_bytes,
            kv_dims: (kd, vd),
            vocab: s.vocab,
            outputs: Vec::new(),
        })
    }

    /// The bounds, with the context clamped to the model's.
    pub fn options(&self) -> &ContextOptions {
        &self.options
    }

    /// Positions each sequence can hold.
    pub fn capacity(&self) -> usize {
        self.kv.capacity()
    }

    /// Positions sequence `seq` has filled (0 for a sequence the context does not hold).
    pub fn len(&self, seq: SeqId) -> usize {
        self.sequences.get(seq).map_or(0, |s| s.len)
    }

    /// Sequences the context holds.
    pub fn sequences(&self) -> usize {
        self.sequences.len()
    }

    /// Bytes the context's KV cache holds, as the backend books them (its element type and
    /// rounding included).
    pub fn kv_bytes(&self) -> u64 {
        self.kv_bytes
    }

    /// The KV storage's paging: block size, groups, and the pool's blocks.
    pub fn kv_plan(&self) -> &crate::layout::context::KvPlan {
        self.kv.plan()
    }

    /// Sets sequence `seq`'s blocks of the full-context layers' pool: `blocks[i]` holds its
    /// positions `i * block ..`, `None` where it holds none (a row there is refused). Refuses a
    /// block the pool does not have.
    pub fn set_blocks(
        &mut self,
        backend: &mut B,
        seq: SeqId,
        blocks: impl IntoIterator<Item = Option<u32>>,
    ) -> Result<()> {
        let blocks: Vec<Option<u32>> = blocks.into_iter().collect();
        // A growing pool backs every block it hands out before a step can touch it.
        let highest = blocks.iter().flatten().max().map_or(0, |&b| b as usize + 1);
        self.kv.back_blocks(backend, highest)?;
        self.kv.tables.set_pool_blocks(seq, blocks)
    }

    /// Points sequence `seq`'s sliding-window layers at ring run `run` (the run sequence `run`
    /// starts with): what a scheduler does when `seq` goes on from the prefix a finished
    /// sequence left in that run ([`crate::kv::RingRuns`]). No-op without window rings.
    pub fn set_ring_run(&mut self, seq: SeqId, run: usize) -> Result<()> {
        self.kv.tables.set_ring_run(seq, run)
    }

    /// Gives back the memory behind the KV pool's blocks from `blocks` on, where the pool
    /// grows: what a server does once a burst is over. The caller (the engine, from its
    /// scheduler's pool) knows that no sequence holds any of them and no cached prefix lives
    /// in them; block `blocks` and later are backed again, zeroed, when handed out.
    pub fn release_kv_blocks_from(&mut self, backend: &mut B, blocks: usize) -> Result<()> {
        self.kv.release_blocks_from(backend, blocks)
    }

    /// Whether the KV pool's memory grows as blocks are handed out (a shared pool on a
    /// backend that maps memory piece by piece), so that it can also be given back.
    pub fn kv_pool_grows(&self) -> bool {
        self.kv.grows()
    }

    /// Blocks of the KV pool backed by memory now: every block unless the pool is shared
    /// ([`ContextOptions::kv_blocks`]), whose storage grows as blocks are handed out.
    pub fn kv_backed_blocks(&self) -> usize {
        self.kv.backed_blocks()
    }

    /// Copies pool blocks in every full-context layer's keys and values: for each `(from, to)`,
    /// block `to` becomes block `from` (copy-on-write of a shared block).
    pub fn copy_blocks(&mut self, backend: &mut B, copies: &[(usize, usize)]) -> Result<()> {
        if copies.is_empty() {
            return Ok(());
        }
        let plan = self.kv.plan();
        let blocks = plan.pool_blocks;
        if let Some(&(from, to)) = copies.iter().find(|&&(f, t)| f >= blocks || t >= blocks) {
            return Err(DecodeError::InvalidArgument(format!(
                "a copy of block {from} to block {to} in a pool of {blocks} blocks"
            )));
        }
        let block = plan.block;
        let (kd, vd) = self.kv_dims;
        for (il, layer) in self.kv.layers.iter().enumerate() {
            if layer.group != crate::kv::KvGroup::POOL {
                continue;
            }
            backend.copy_blocks(&mut self.kv.k[il], copies, block * kd)?;
            backend.copy_blocks(&mut self.kv.v[il], copies, block * vd)?;
        }
        Ok(())
    }

    /// Rows of logits one step can keep.
    pub fn logit_rows(&self) -> usize {
        self.logit_rows
    }

    /// Most rows a padded decode step may have: what the activations, the logits and the
    /// backend's decode attention workspace (a row per sequence) were sized for.
    pub(crate) fn max_padded_rows(&self) -> usize {
        let o = &self.options;
        o.max_batch.min(o.sequences).min(self.logit_rows)
    }

    /// Empties sequence `seq` (its next row starts at position 0) and drops its sampler; the
    /// memory stays allocated.
    pub fn clear(&mut self, seq: SeqId) {
        if let Some(s) = self.sequences.get_mut(seq) {
            *s = Sequence::default();
        }
        self.outputs.retain(|&(_, s)| s != seq);
    }

    /// Starts sequence `seq` anew with `prefix` already in its blocks (a prefix another
    /// sequence computed, found in the prefix cache): its next row is at `prefix.len()`, the
    /// prefix's tokens count for the penalties, and its sampler is dropped.
    pub fn start(&mut self, seq: SeqId, prefix: &[u32]) -> Result<()> {
        if prefix.len() > self.capacity() {
            return Err(DecodeError::ContextFull {
                needed: prefix.len(),
                capacity: self.capacity(),
            });
        }
        self.clear(seq);
        let s = self.sequence_mut(seq)?;
        s.len = prefix.len();
        let skip = prefix
            .len()
            .saturating_sub(crate::sampler::MAX_REPEAT_LAST_N);
        for (pos, &t) in prefix.iter().enumerate().skip(skip) {
            s.remember(pos, t);
        }
        Ok(())
    }

    /// Keeps sequence `seq`'s first `len` positions and drops the rest (its next row is at
    /// `len`), and its sampler.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<()> {
        let s = self.sequence_mut(seq)?;
        if len > s.len {
            return Err(DecodeError::InvalidArgument(format!(
                "truncating sequence {seq} to {len} positions, past the {} it holds",
                s.len
            )));
        }
        s.len = len;
        s.sampler = None;
        s.recent.retain(|&(pos, _)| pos < len);
        self.outputs.retain(|&(_, s)| s != seq);
        Ok(())
    }

    /// Sequence `seq`'s last tokens, oldest first (what the penalties look back over).
    pub fn recent_tokens(&self, seq: SeqId) -> Vec<u32> {
        self.sequences
            .get(seq)
            .map(|s| s.recent.iter().map(|&(_, t)| t).collect())
            .unwrap_or_default()
    }

    fn sequence_mut(&mut self, seq: SeqId) -> Result<&mut Sequence> {
        let n = self.sequences.len();
        self.sequences.get_mut(seq).ok_or_else(|| {
            DecodeError::InvalidArgument(format!("sequence {seq} in a context of {n} sequences"))
        })
    }

    /// Starts sequence `seq`'s sampling stream again from its seed at its next sampled row.
    pub fn restart_sampler(&mut self, seq: SeqId) {
        if let Some(s) = self.sequences.get_mut(seq) {
            s.sampler = None;
        }
    }

    /// The last step's logits of row `row` of that step, copied to the host.
    pub fn read_logits(&self, backend: &mut B, row: usize, out: &mut Vec<f32>) -> Result<()> {
        let index = self.output_index(row)?;
        let vocab = self.vocab;
        out.resize(vocab, 0.0);
        backend.read(&self.act.logits, index * vocab, out)
    }

    /// Where row `row` of the last step is in the logits buffer.
    pub(crate) fn output_index(&self, row: usize) -> Result<usize> {
        self.outputs
            .iter()
            .position(|&(r, _)| r == row)
            .ok_or_else(|| {
                DecodeError::InvalidArgument(format!(
                    "row {row} of the last step kept no logits (rows that did: {:?}); mark it \
                     RowOutput::Logits or Sample",
                    self.outputs.iter().map(|&(r, _)| r).collect::<Vec<_>>()
                ))
            })
    }

    /// Checks `batch` against the context before anything runs: sequences it holds, each
    /// sequence's rows at its next positions within its capacity, room for the rows and their
    /// logits.
    pub(crate) fn check_batch(&self, batch: &crate::batch::StepBatch, vocab: usize) -> Result<()> {
        if batch.is_empty() {
            return Err(DecodeError::InvalidArgument(
                "an empty step batch: give at least one row".into(),
            ));
        }
        if batch.len() > self.options.max_batch {
            return Err(DecodeError::InvalidArgument(format!(
                "a step of {} rows in a context made for at most {} (ContextOptions::max_batch)",
                batch.len(),
                self.options.max_batch
            )));
        }
        let outputs = if self.options.all_logits {
            batch.len()
        } else {
            batch.n_outputs()
        };
        if outputs > self.logit_rows {
            return Err(DecodeError::InvalidArgument(format!(
                "{outputs} rows of the step want logits but the context keeps {} per step (one \
                 per sequence)",
                self.logit_rows
            )));
        }
        let mut next: Vec<usize> = self.sequences.iter().map(|s| s.len).collect();
        for row in batch.rows() {
            if row.token as usize >= vocab {
                return Err(DecodeError::TokenOutOfRange {
                    id: row.token,
                    vocab,
                });
            }
            let Some(expected) = next.get_mut(row.seq) else {
                return Err(DecodeError::InvalidArgument(format!(
                    "a row of sequence {} in a context of {} sequences",
                    row.seq,
                    self.sequences.len()
                )));
            };
            if row.pos != *expected {
                return Err(DecodeError::InvalidArgument(format!(
                    "a row of sequence {} at position {} where its next position is {}: a \
                     sequence's rows come in order from its length",
                    row.seq, row.pos, *expected
                )));
            }
            if row.pos >= self.capacity() {
                return Err(DecodeError::ContextFull {
                    needed: row.pos + 1,
                    capacity: self.capacity(),
                });
            }
            let pool = crate::kv::KvGroup::POOL;
            if self.kv.tables.row(pool, row.seq, row.pos).is_none() {
                return Err(DecodeError::InvalidArgument(format!(
                    "sequence {}'s position {} has no KV block: give the sequence its blocks \
                     with Context::set_blocks first",
                    row.seq, row.pos
                )));
            }
            *expected += 1;
        }
        Ok(())
    }

    /// Records a step that ran: each sequence's new length and the rows whose logits the
    /// logits buffer holds.
    pub(crate) fn finish_step(&mut self, batch: &crate::batch::StepBatch) {
        for row in batch.rows() {
            let s = &mut self.sequences[row.seq];
            s.len += 1;
            s.remember(row.pos, row.token);
        }
        self.outputs.clear();
        if self.options.all_logits {
            self.outputs
                .extend(batch.sequences().iter().copied().enumerate());
        } else {
            let seqs = batch.sequences();
            self.outputs
                .extend(batch.output_rows().map(|r| (r, seqs[r])));
        }
    }

    /// Sequence `seq`'s sampler for `config`, made anew when it has none or other settings.
    pub(crate) fn sampler(&mut self, seq: SeqId, config: &SamplerConfig) -> Result<&mut Sampler> {
        let slot = &mut self.sequences[seq].sampler;
        if slot.as_ref().is_none_or(|s| s.config() != config) {
            *slot = Some(Sampler::new(*config)?);
        }
        slot.as_mut()
            .ok_or_else(|| DecodeError::InvalidArgument(format!("sequence {seq} has no sampler")))
    }
}

/// Refuses a KV cache type whose blocks do not tile this model's heads (q8_0 needs head sizes
/// of whole 32-value blocks, so each head's keys start on a block), before anything is
/// allocated.
fn check_kv_type(s: &crate::model::ModelSpec, kv: crate::kv::KvType) -> Result<()> {
    let block = kv.block_values();
    for (what, dim) in [("key", s.head_dim_k), ("value", s.head_dim_v)] {
        if dim % block != 0 {
            return Err(DecodeError::InvalidArgument(format!(
                "a {kv} KV cache stores heads of whole {block}-value blocks, but this model's \
                 {what} heads have {dim} values; use -ctk f16 -ctv f16 (or f32)"
            )));
        }
    }
    Ok(())
}
