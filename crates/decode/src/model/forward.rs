//! The forward pass of one [`StepBatch`] through a [`Model`] and a [`Context`]: embedding,
//! every layer's attention and feed-forward blocks, and the logits of the rows that want them,
//! then the tokens of the rows that asked for one.

use super::{Ffn, Model};
use crate::backend::{Attention, Backend, KvDestination, MoeShape, StepKey};
use crate::batch::{RowOutput, StepBatch};
use crate::context::{Context, Sampled};
use crate::error::Result;

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

impl<B: Backend> Model<B> {
    /// Runs `batch` through `ctx` on `backend` (the backend the model and the context live
    /// on): each row's keys and values join its sequence's cache, the rows that want logits
    /// keep them in the context, and the rows that asked for a token get one, drawn by their
    /// own sampler. The batch is checked whole before anything runs, so a refused batch
    /// changes nothing.
    pub fn step(
        &self,
        backend: &mut B,
        ctx: &mut Context<B>,
        batch: &StepBatch,
    ) -> Result<Vec<Sampled>> {
        ctx.check_batch(batch, self.spec.vocab)?;
        let n = batch.len();
        let all_logits = ctx.options().all_logits;
        let n_out = if all_logits { n } else { batch.n_outputs() };
        let Model {
            spec: s,
            embed,
            output_norm,
            output,
            rope_factors,
            layers,
            ..
        } = self;
        let Context { kv, act: a, .. } = &mut *ctx;
        let key = StepKey {
            phase: batch.phase(),
            n_tokens: n,
            n_outputs: n_out,
        };
        backend.begin_step(batch, &kv.tables)?;
        backend.run_step(key, &mut |be: &mut B| {
            let e = s.n_embd;
            let (kd, vd) = (s.widths.k, s.widths.v);
            be.embed(embed, n, s.embed_scale, &mut a.x)?;
            // Each block's output waits in `a.proj` and is added to the residual stream by the
            // next norm (`add_rms_norm`: one kernel on the GPU), after its own post-block norm
            // where the model has one (`add_normed_rms_norm`, the same kernel).
            let mut pending: Pending<'_, B> = Pending::Nothing;
            for (il, (layer, ls)) in layers.iter().zip(&s.layers).enumerate() {
                // Attention block.
                let attn_norm = &layer.attn_norm;
                pending.add_and_norm(
                    be,
                    &mut a.x,
                    &mut a.proj,
                    attn_norm,
                    &mut a.xn,
                    n,
                    e,
                    s.eps,
                )?;
                be.matmul_pair(&layer.wq, &layer.wk, &a.xn, &mut a.q, &mut a.k, n)?;
                be.matmul(&layer.wv, &a.xn, &mut a.v, n)?;
                if let Some([bq, bk, bv]) = &layer.bias {
                    be.add_bias(&mut a.q, bq, n)?;
                    be.add_bias(&mut a.k, bk, n)?;
                    be.add_bias(&mut a.v, bv, n)?;
                }
                if let Some([qn, kn]) = &layer.qk_norm {
                    be.rms_norm_inplace_qk(
                        (&mut a.q, qn, n * s.n_head),
                        (&mut a.k, kn, n * s.n_head_kv),
                        s.head_dim_k,
                        s.eps,
                    )?;
                }
                let rf = rope_factors.as_ref();
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
                let shape = Attention {
                    n_tokens: n,
                    n_head: s.n_head,
                    n_head_kv: s.n_head_kv,
                    head_dim_k: s.head_dim_k,
                    head_dim_v: s.head_dim_v,
                    scale: s.attn_scale,
                    window: ls.window,
                    slots: layer_kv.slots,
                };
                let group = layer_kv.group;
                be.attention(&a.q, &kv.k[il], &kv.v[il], &mut a.attn, &shape, group)?;
                be.matmul(&layer.wo, &a.attn, &mut a.proj, n)?;
                // Feed-forward block.
                Pending::Output(layer.attn_post_norm.as_ref()).add_and_norm(
                    be,
                    &mut a.x,
                    &mut a.proj,
                    &layer.ffn_norm,
                    &mut a.xn,
                    n,
                    e,
                    s.eps,
                )?;
                match &layer.ffn {
                    Ffn::Dense { gate, up, down } => {
                        be.matmul_pair(gate, up, &a.xn, &mut a.gate, &mut a.up, n)?;
                        be.gated(&mut a.gate, &a.up, n * s.n_ff, s.gate)?;
                        be.matmul(down, &a.gate, &mut a.proj, n)?;
                    }
                    Ffn::Moe {
                        router,
                        gate,
                        up,
                        down,
                    } => {
                        be.matmul(router, &a.xn, &mut a.router, n)?;
                        let shape = MoeShape {
                            rows: n,
                            n_embd: e,
                            n_ff: s.n_ff_expert,
                            n_expert: s.n_expert,
                            k: s.n_expert_used,
                            act: s.gate,
                        };
                        be.moe(&a.xn, &a.router, gate, up, down, &mut a.proj, &shape)?;
                    }
                }
                pending = Pending::Output(layer.ffn_post_norm.as_ref());
            }
            let out_w = output.as_ref().unwrap_or(embed);
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
                be.matmul(out_w, &a.xn, &mut a.logits, n)?;
            } else if n_out > 0 {
                // Only some rows' logits: the whole residual, then those rows gathered in
                // order and normed.
                if let Pending::Output(post_norm) = pending {
                    if let Some(w) = post_norm {
                        be.rms_norm_inplace(&mut a.proj, w, n, e, s.eps)?;
                    }
                    be.add(&mut a.x, &a.proj, n * e)?;
                }
                for (i, row) in batch.output_rows().enumerate() {
                    be.copy_row(&a.x, row, &mut a.proj, i, e)?;
                }
                be.rms_norm(&a.proj, output_norm, &mut a.xn, n_out, e, s.eps)?;
                be.matmul(out_w, &a.xn, &mut a.logits, n_out)?;
            }
            Ok(())
        })?;
        ctx.finish_step(batch);
        self.sample_rows(backend, ctx, batch)
    }

    /// The tokens of the rows that asked for one: greedy on the backend, or the row's sampler
    /// on the backend where it samples, else on the host with the same draw.
    fn sample_rows(
        &self,
        backend: &mut B,
        ctx: &mut Context<B>,
        batch: &StepBatch,
    ) -> Result<Vec<Sampled>> {
        let vocab = self.spec.vocab;
        let mut sampled = Vec::new();
        let mut logits = Vec::new();
        for row in batch.output_rows() {
            let RowOutput::Sample(config) = batch.outputs()[row] else {
                continue;
            };
            let seq = batch.sequences()[row];
            let index = ctx.output_index(row)?;
            let token = if config.is_greedy() && !config.has_penalties() {
                backend.argmax(&ctx.act.logits, index, vocab)?
            } else {
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
                match on_device {
                    Some(token) => token,
                    None => {
                        ctx.read_logits(backend, row, &mut logits)?;
                        let recent = ctx.recent_tokens(seq);
                        (ctx.sampler(seq, &config)?).sample_with_history(&mut logits, &recent, draw)
                    }
                }
            };
            sampled.push(Sampled { row, seq, token });
        }
        Ok(sampled)
    }
}
