//! The forward pass of one [`StepBatch`] through a [`Model`] and a [`Context`]: embedding,
//! every layer's attention and feed-forward blocks, and the logits of the rows that want them,
//! then the tokens of the rows that asked for one.

use super::{Ffn, Model};
use crate::backend::{Attention, Backend, KvDestination, MoeShape, StepKey};
use crate::batch::{RowOutput, SeqId, StepBatch};
use crate::context::{Activations, Context, KvCache, Sampled, StepResults};
use crate::error::{DecodeError, Result};

/// What waits in the block-output buffer for the next norm to add to the residual stream.
enum Pending<'w, B: Backend> {
    /// Nothing (before the first layer).
    Nothing,
    /// A block's output, with the model's norm of it where it has one (Gemma 3).
    Output(Option<&'w B::Weight>),
}

// Not derived: a derive would ask for `B: Copy`, and only the reference is copied.
impl<B: Backend> Clone for Pending<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: Backend> Copy for Pending<'_, B> {}

impl<B: Backend> Pending<'_, B> {
    /// `x += y` (with `y` normalized first where the block has a post-norm), then `xn =
    /// norm(x)`: one backend call, so one kernel on the GPU.
    #[allow(clippy::too_many_arguments)]
    fn add_and_norm(
        self,
        be: &mut B,
        x: &mut B::Buffer,
        y: &mut B::Buffer,
        norm: &B::Weight,
        xn: &mut B::Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        match self {
            Pending::Nothing => be.add_rms_norm(x, None, norm, xn, rows, dim, eps),
            Pending::Output(None) => be.add_rms_norm(x, Some(y), norm, xn, rows, dim, eps),
            Pending::Output(Some(post)) => {
                be.add_normed_rms_norm(x, (y, post), norm, xn, rows, dim, eps)
            }
        }
    }
}

/// Where in a step an op's output is: the weight that made it (its GGUF name without the
/// `blk.N.` prefix) or the op, in layer `layer` (`None`: before or after the layers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Site {
    layer: Option<usize>,
    what: Made,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Made {
    /// A product with, or a norm by, this tensor.
    Weight(&'static str),
    /// An op with no weight of its own.
    Op(&'static str),
}

impl Site {
    fn top(what: Made) -> Site {
        Site { layer: None, what }
    }
    fn layer(il: usize, what: Made) -> Site {
        Site {
            layer: Some(il),
            what,
        }
    }
}

impl std::fmt::Display for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.layer, self.what) {
            (None, Made::Weight(w)) => write!(f, "tensor {w}"),
            (None, Made::Op(op)) => write!(f, "the {op}"),
            (Some(il), Made::Weight(w)) => write!(f, "layer {il}, tensor blk.{il}.{w}"),
            (Some(il), Made::Op(op)) => write!(f, "layer {il}, the {op}"),
        }
    }
}

/// Called after each op of a step with where its output is, the buffer and the values it
/// wrote: nothing in a normal step; in a checked re-run ([`Model::step`] after non-finite
/// logits), a finiteness check.
type Probe<'p, B> = dyn FnMut(&mut B, Site, &<B as Backend>::Buffer, usize) -> Result<()> + 'p;

/// A row whose logits were not finite.
struct NonFinite {
    row: usize,
    seq: SeqId,
}

impl<B: Backend> Model<B> {
    /// Runs `batch` through `ctx` on `backend` (the backend the model and the context live
    /// on): each row's keys and values join its sequence's cache, the rows that want logits
    /// keep them in the context, and the rows that asked for a token get one, drawn by their
    /// own sampler. The batch is checked whole before anything runs, so a refused batch
    /// changes nothing. A row whose logits are not finite is a
    /// [`DecodeError::NonFiniteLogits`] error (the first such row's); [`Model::step_rows`]
    /// gives every row its own outcome instead.
    pub fn step(
        &self,
        backend: &mut B,
        ctx: &mut Context<B>,
        batch: &StepBatch,
    ) -> Result<Vec<Sampled>> {
        let mut results = self.step_rows(backend, ctx, batch)?;
        match results.failed.is_empty() {
            true => Ok(results.sampled),
            false => Err(results.failed.swap_remove(0).1),
        }
    }

    /// [`Model::step`], with each row that asked for a token answered on its own: a row whose
    /// logits hold NaN or infinity gets no token but a [`DecodeError::NonFiniteLogits`] that
    /// names the first op of its rows whose output is not finite, found by running its
    /// sequence's rows of the step again with every op's output checked (on the host where
    /// the logits are: the CPU backend's, or the rows a host sampler reads). Its sequence is
    /// then cleared; the other rows keep their tokens. An error of the step itself (`Err`)
    /// is every row's.
    pub fn step_rows(
        &self,
        backend: &mut B,
        ctx: &mut Context<B>,
        batch: &StepBatch,
    ) -> Result<StepResults> {
        self.forward(backend, ctx, batch, None)?;
        let (sampled, non_finite) = self.sample_rows(backend, ctx, batch)?;
        let failed = non_finite
            .into_iter()
            .map(|NonFinite { row, seq }| {
                let culprit = self.diagnose(backend, ctx, batch, seq);
                ctx.clear(seq);
                let (pos, token) = (batch.positions()[row], batch.tokens()[row]);
                let error = DecodeError::NonFiniteLogits {
                    seq,
                    pos,
                    token,
                    culprit,
                };
                (row, error)
            })
            .collect();
        Ok(StepResults { sampled, failed })
    }

    /// The op a checked re-run of sequence `seq`'s rows of `batch` finds first with a
    /// non-finite output, in words. The sequence goes back to where the step found it and
    /// runs those rows again, op by op outside any captured graph, each output read back.
    fn diagnose(
        &self,
        backend: &mut B,
        ctx: &mut Context<B>,
        batch: &StepBatch,
        seq: SeqId,
    ) -> String {
        let rows: Vec<_> = batch.rows().filter(|r| r.seq == seq).collect();
        let Some(first) = rows.first() else {
            return "its rows are not in the step".into();
        };
        let mut again = StepBatch::new();
        for (i, row) in rows.iter().enumerate() {
            let output = match i + 1 == rows.len() {
                true => RowOutput::Logits,
                false => RowOutput::Nothing,
            };
            again.push(crate::batch::BatchRow { output, ..*row });
        }
        let mut found: Option<Site> = None;
        let mut host = Vec::new();
        let mut check = |be: &mut B, site: Site, buffer: &B::Buffer, len: usize| -> Result<()> {
            if found.is_none() {
                host.resize(len, 0.0);
                be.read(buffer, 0, &mut host)?;
                if host.iter().any(|v| !v.is_finite()) {
                    found = Some(site);
                }
            }
            Ok(())
        };
        let ran = ctx
            .truncate(seq, first.pos)
            .and_then(|()| self.forward(backend, ctx, &again, Some(&mut check)));
        match (ran, found) {
            (Err(e), _) => format!("the re-run of the step to find where failed: {e}"),
            (Ok(()), Some(site)) => {
                format!("a checked re-run of the step finds the first non-finite output at {site}")
            }
            (Ok(()), None) => "a checked re-run of the step found every op's output finite \
                               (the first run differed from it)"
                .into(),
        }
    }

    /// The forward pass of `batch`: every op, through the backend's [`Backend::run_step`]
    /// (which may replay a captured graph); with `probe`, run op by op and probed after each.
    fn forward(
        &self,
        backend: &mut B,
        ctx: &mut Context<B>,
        batch: &StepBatch,
        probe: Option<&mut Probe<'_, B>>,
    ) -> Result<()> {
        ctx.check_batch(batch, self.spec.vocab)?;
        let all_logits = ctx.options().all_logits;
        let n_outputs = |b: &StepBatch| if all_logits { b.len() } else { b.n_outputs() };
        let mut key = StepKey {
            phase: batch.phase(),
            n_tokens: batch.len(),
            n_outputs: n_outputs(batch),
        };
        // A probed run goes op by op, so it is never padded for a graph.
        let padded = match probe {
            None => batch.padded_to(backend.bucket_rows(key).min(ctx.max_padded_rows())),
            Some(_) => None,
        };
        let run = padded.as_ref().unwrap_or(batch);
        key.n_tokens = run.len();
        key.n_outputs = n_outputs(run);
        let Context { kv, act: a, .. } = &mut *ctx;
        backend.begin_step(run, &kv.tables)?;
        let n_out = key.n_outputs;
        match probe {
            None => backend.run_step(key, &mut |be: &mut B| {
                self.ops(be, a, kv, run, n_out, &mut |_, _, _, _| Ok(()))
            })?,
            Some(probe) => self.ops(backend, a, kv, run, n_out, probe)?,
        }
        // The padding rows' logits follow the real rows' and are never read.
        ctx.finish_step(batch);
        Ok(())
    }

    /// The ops of one step, each followed by a call of `probe` with its output.
    fn ops(
        &self,
        be: &mut B,
        a: &mut Activations<B>,
        kv: &mut KvCache<B>,
        batch: &StepBatch,
        n_out: usize,
        probe: &mut Probe<'_, B>,
    ) -> Result<()> {
        let Model {
            spec: s,
            embed,
            output_norm,
            output,
            output_split,
            rope_factors,
            layers,
            shard,
            ..
        } = self;
        let sharded = !shard.is_whole();
        let n = batch.len();
        let e = s.n_embd;
        let (kd, vd) = (s.widths.k, s.widths.v);
        let (qd, od) = (s.widths.q, s.n_head * s.head_dim_v);
        use Made::{Op, Weight};
        be.embed(embed, n, s.embed_scale, &mut a.x)?;
        probe(be, Site::top(Weight("token_embd.weight")), &a.x, n * e)?;
        // Each block's output waits in `a.proj` and is added to the residual stream by the
        // next norm (`add_rms_norm`: one kernel on the GPU), after its own post-block norm
        // where the model has one (`add_normed_rms_norm`, the same kernel).
        let mut pending: Pending<'_, B> = Pending::Nothing;
        // Where the block output waiting in `pending` comes from, for the probes.
        let mut post_site = Site::top(Op("embedding"));
        for (il, (layer, ls)) in layers.iter().zip(&s.layers).enumerate() {
            let at = |what| Site::layer(il, what);
            // Attention block.
            let attn_norm = &layer.attn_norm;
            pending.add_and_norm(be, &mut a.x, &mut a.proj, attn_norm, &mut a.xn, n, e, s.eps)?;
            if il > 0 {
                probe(be, post_site, &a.proj, n * e)?;
            }
            probe(be, at(Op("residual add")), &a.x, n * e)?;
            probe(be, at(Weight("attn_norm.weight")), &a.xn, n * e)?;
            be.matmul_pair(&layer.wq, &layer.wk, &a.xn, &mut a.q, &mut a.k, n)?;
            probe(be, at(Weight("attn_q.weight")), &a.q, n * qd)?;
            probe(be, at(Weight("attn_k.weight")), &a.k, n * kd)?;
            be.matmul(&layer.wv, &a.xn, &mut a.v, n)?;
            probe(be, at(Weight("attn_v.weight")), &a.v, n * vd)?;
            if let Some([bq, bk, bv]) = &layer.bias {
                be.add_bias(&mut a.q, bq, n)?;
                be.add_bias(&mut a.k, bk, n)?;
                be.add_bias(&mut a.v, bv, n)?;
                probe(be, at(Weight("attn_q.bias")), &a.q, n * qd)?;
                probe(be, at(Weight("attn_k.bias")), &a.k, n * kd)?;
                probe(be, at(Weight("attn_v.bias")), &a.v, n * vd)?;
            }
            if let Some([qn, kn]) = &layer.qk_norm {
                be.rms_norm_inplace_qk(
                    (&mut a.q, qn, n * s.n_head),
                    (&mut a.k, kn, n * s.n_head_kv),
                    s.head_dim_k,
                    s.eps,
                )?;
                probe(be, at(Weight("attn_q_norm.weight")), &a.q, n * qd)?;
                probe(be, at(Weight("attn_k_norm.weight")), &a.k, n * kd)?;
            }
            let rf = rope_factors.for_context(s, kv.capacity());
            let (nh, nkv, hd) = (s.n_head, s.n_head_kv, s.head_dim_k);
            let layer_kv = kv.layers[il];
            let dest = KvDestination {
                k_cache: &mut kv.k[il],
                v_cache: &mut kv.v[il],
                k_dim: kd,
                v_dim: vd,
                layer: layer_kv,
            };
            let heads = (nh, nkv, hd);
            be.rope_qk_store_kv(&mut a.q, &mut a.k, &a.v, n, heads, &ls.rope, rf, dest)?;
            probe(be, at(Op("rotary embedding of the queries")), &a.q, n * qd)?;
            probe(be, at(Op("rotary embedding of the keys")), &a.k, n * kd)?;
            let shape = Attention {
                n_tokens: n,
                n_head: s.n_head,
                n_head_kv: s.n_head_kv,
                head_dim_k: s.head_dim_k,
                head_dim_v: s.head_dim_v,
                scale: s.attn_scale,
                softcap: s.attn_softcap,
                window: ls.window,
                slots: layer_kv.slots,
            };
            let group = layer_kv.group;
            be.attention(&a.q, &kv.k[il], &kv.v[il], &mut a.attn, &shape, group)?;
            // Non-finite here with finite queries: the cache of an earlier step holds it.
            probe(be, at(Op("attention over the KV cache")), &a.attn, n * od)?;
            be.matmul(&layer.wo, &a.attn, &mut a.proj, n)?;
            if sharded {
                // Each rank's heads gave a part of the sum; every rank needs all of it.
                be.all_reduce_sum(&mut a.proj, n * e)?;
            }
            probe(be, at(Weight("attn_output.weight")), &a.proj, n * e)?;
            // Feed-forward block.
            let attn_post = layer.attn_post_norm.as_ref();
            Pending::Output(attn_post).add_and_norm(
                be,
                &mut a.x,
                &mut a.proj,
                &layer.ffn_norm,
                &mut a.xn,
                n,
                e,
                s.eps,
            )?;
            if attn_post.is_some() {
                probe(be, at(Weight("post_attention_norm.weight")), &a.proj, n * e)?;
            }
            probe(be, at(Op("residual add")), &a.x, n * e)?;
            probe(be, at(Weight("ffn_norm.weight")), &a.xn, n * e)?;
            match &layer.ffn {
                Ffn::Dense { gate, up, down } => {
                    be.matmul_pair(gate, up, &a.xn, &mut a.gate, &mut a.up, n)?;
                    probe(be, at(Weight("ffn_gate.weight")), &a.gate, n * s.n_ff)?;
                    probe(be, at(Weight("ffn_up.weight")), &a.up, n * s.n_ff)?;
                    be.gated(&mut a.gate, &a.up, n * s.n_ff, s.gate)?;
                    probe(be, at(Op("gated activation")), &a.gate, n * s.n_ff)?;
                    be.matmul(down, &a.gate, &mut a.proj, n)?;
                    if sharded {
                        be.all_reduce_sum(&mut a.proj, n * e)?;
                    }
                    probe(be, at(Weight("ffn_down.weight")), &a.proj, n * e)?;
                }
                Ffn::Moe {
                    router,
                    gate,
                    up,
                    down,
                } => {
                    be.matmul(router, &a.xn, &mut a.router, n)?;
                    probe(
                        be,
                        at(Weight("ffn_gate_inp.weight")),
                        &a.router,
                        n * s.n_expert,
                    )?;
                    let shape = MoeShape {
                        rows: n,
                        n_embd: e,
                        n_ff: s.n_ff_expert,
                        n_expert: s.n_expert,
                        k: s.n_expert_used,
                        act: s.gate,
                    };
                    be.moe(&a.xn, &a.router, gate, up, down, &mut a.proj, &shape)?;
                    if sharded {
                        be.all_reduce_sum(&mut a.proj, n * e)?;
                    }
                    let experts = Op("experts (ffn_gate_exps, ffn_up_exps, ffn_down_exps)");
                    probe(be, at(experts), &a.proj, n * e)?;
                }
            }
            pending = Pending::Output(layer.ffn_post_norm.as_ref());
            post_site = match layer.ffn_post_norm {
                Some(_) => at(Weight("post_ffw_norm.weight")),
                None => at(Weight("ffn_down.weight")),
            };
        }
        let out_w = output.as_ref().unwrap_or(embed);
        let out_site = match output {
            Some(_) => Site::top(Weight("output.weight")),
            None => Site::top(Weight("token_embd.weight (the tied output)")),
        };
        let norm_site = Site::top(Weight("output_norm.weight"));
        if n_out == n {
            pending.add_and_norm(
                be,
                &mut a.x,
                &mut a.proj,
                output_norm,
                &mut a.xn,
                n,
                e,
                s.eps,
            )?;
            probe(be, post_site, &a.proj, n * e)?;
            probe(be, Site::top(Op("last residual add")), &a.x, n * e)?;
            probe(be, norm_site, &a.xn, n * e)?;
            be.matmul(out_w, &a.xn, &mut a.logits, n)?;
            if *output_split {
                be.all_gather_cols(&mut a.logits, n, s.vocab / shard.ranks)?;
            }
        } else if n_out > 0 {
            // Only some rows' logits: the whole residual, then those rows gathered in
            // order and normed.
            if let Pending::Output(post_norm) = pending {
                if let Some(w) = post_norm {
                    be.rms_norm_inplace(&mut a.proj, w, n, e, s.eps)?;
                }
                probe(be, post_site, &a.proj, n * e)?;
                be.add(&mut a.x, &a.proj, n * e)?;
                probe(be, Site::top(Op("last residual add")), &a.x, n * e)?;
            }
            for (i, row) in batch.output_rows().enumerate() {
                be.copy_row(&a.x, row, &mut a.proj, i, e)?;
            }
            be.rms_norm(&a.proj, output_norm, &mut a.xn, n_out, e, s.eps)?;
            probe(be, norm_site, &a.xn, n_out * e)?;
            be.matmul(out_w, &a.xn, &mut a.logits, n_out)?;
            if *output_split {
                be.all_gather_cols(&mut a.logits, n_out, s.vocab / shard.ranks)?;
            }
        }
        if let (Some(cap), true) = (s.final_softcap, n_out > 0) {
            be.softcap(&mut a.logits, n_out * s.vocab, cap)?;
        }
        probe(be, out_site, &a.logits, n_out * s.vocab)
    }

    /// The tokens of the rows that asked for one: greedy on the backend, or the row's sampler
    /// on the backend where it samples, else on the host with the same draw. A row whose
    /// logits the host sees (a host sampler's, or any on a backend whose buffers are host
    /// memory) and finds NaN or infinite in gets no token but a place in the second list.
    /// Greedy rows are picked together, one [`Backend::argmax_rows`] per run of consecutive
    /// logit rows (usually the whole batch), so a batched step costs one launch and one read
    /// back on the GPU rather than a pair per row. Both lists are in row order.
    fn sample_rows(
        &self,
        backend: &mut B,
        ctx: &mut Context<B>,
        batch: &StepBatch,
    ) -> Result<(Vec<Sampled>, Vec<NonFinite>)> {
        let vocab = self.spec.vocab;
        let mut sampled = Vec::new();
        let mut non_finite = Vec::new();
        let mut logits = Vec::new();
        // (row, seq, row of the logits) of the greedy rows, in row order.
        let mut greedy: Vec<(usize, SeqId, usize)> = Vec::new();
        let finite = |values: &[f32]| values.iter().all(|v| v.is_finite());
        for row in batch.output_rows() {
            let RowOutput::Sample(config) = batch.outputs()[row] else {
                continue;
            };
            let seq = batch.sequences()[row];
            let index = ctx.output_index(row)?;
            // A greedy pick of NaN logits is a token the model never chose, so no token is
            // drawn from them. Free where they are host memory; elsewhere only the host
            // sampler's copy below is looked at, so a device's step gains no copy.
            let in_host = backend.host_values(&ctx.act.logits);
            let row_values = in_host.and_then(|v| v.get(index * vocab..(index + 1) * vocab));
            if row_values.is_some_and(|v| !finite(v)) {
                non_finite.push(NonFinite { row, seq });
                continue;
            }
            if config.is_greedy() && !config.has_penalties() {
                greedy.push((row, seq, index));
                continue;
            }
            // A greedy chain draws nothing: its stream stays where it was.
            let draw = if config.is_greedy() {
                0.0
            } else {
                ctx.sampler(seq, &config)?.next_draw()
            };
            let on_device = match config.needs_host() {
                false => backend.sample(&ctx.act.logits, index, vocab, &config, draw)?,
                true => None,
            };
            let token = match on_device {
                Some(token) => token,
                None => {
                    ctx.read_logits(backend, row, &mut logits)?;
                    if !finite(&logits) {
                        non_finite.push(NonFinite { row, seq });
                        continue;
                    }
                    let recent = ctx.recent_tokens(seq);
                    (ctx.sampler(seq, &config)?).sample_with_history(&mut logits, &recent, draw)
                }
            };
            sampled.push(Sampled { row, seq, token });
        }
        if !greedy.is_empty() {
            let indices: Vec<usize> = greedy.iter().map(|&(_, _, index)| index).collect();
            let mut tokens = Vec::with_capacity(greedy.len());
            for (first, len) in index_runs(&indices) {
                tokens.extend(backend.argmax_rows(&ctx.act.logits, first, len, vocab)?);
            }
            if tokens.len() != greedy.len() {
                return Err(DecodeError::InvalidArgument(format!(
                    "the backend gave {} greedy tokens for {} rows",
                    tokens.len(),
                    greedy.len()
                )));
            }
            let picked = greedy.iter().zip(tokens);
            sampled.extend(picked.map(|(&(row, seq, _), token)| Sampled { row, seq, token }));
            // Callers (`engine::run_plan`) match the tokens to the rows in row order.
            sampled.sort_by_key(|s| s.row);
        }
        Ok((sampled, non_finite))
    }
}

/// The maximal runs of consecutive values in `indices`, in order, as (first, length):
/// [0, 1, 2, 5, 6, 9] gives (0, 3), (5, 2), (9, 1).
fn index_runs(indices: &[usize]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &index in indices {
        match runs.last_mut() {
            Some((first, len)) if first.checked_add(*len) == Some(index) => *len += 1,
            _ => runs.push((index, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::index_runs;

    #[test]
    fn index_runs_split_at_every_gap() {
        assert_eq!(index_runs(&[0, 1, 2, 5, 6, 9]), [(0, 3), (5, 2), (9, 1)]);
        assert_eq!(index_runs(&[0, 1, 2, 3]), [(0, 4)]);
        assert_eq!(index_runs(&[]), []);
        assert_eq!(index_runs(&[7]), [(7, 1)]);
        // Out of order or repeated: a run only continues with the next index up.
        assert_eq!(index_runs(&[3, 2, 3, 4, 4]), [(3, 1), (2, 3), (4, 1)]);
        assert_eq!(index_runs(&[usize::MAX, 0]), [(usize::MAX, 1), (0, 1)]);
    }
}
