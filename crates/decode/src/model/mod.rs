//! A decoder model over a [`Backend`]: weights, KV cache, activation buffers and the forward
//! pass shared by every architecture, with the differences taken from [`ModelSpec`].

mod consistency;
mod kv_cache;
mod spec;

pub use consistency::AttentionWidths;
pub use kv_cache::KvCache;
pub use spec::{query_pre_attn_scalar, LayerSpec, ModelSpec, GEMMA3_27B_LAYERS};

use crate::backend::{
    Attention, Backend, KvDestination, MappedTensor, MoeShape, StepBounds, StepKey, WeightSource,
};
use crate::error::{DecodeError, Result};
use crate::memory::{MemoryReport, MemoryTag};
use gguf_loader::GgufFile;
use std::sync::Arc;

/// Sizes chosen when a model is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelOptions {
    /// Positions the KV cache holds (clamped to the model's trained context).
    pub context: usize,
    /// Most tokens one forward call processes at once (prefill chunk).
    pub max_batch: usize,
    /// Keep logits for every position of a batch, not just the last (reference checks).
    pub all_logits: bool,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            context: 4096,
            max_batch: 64,
            all_logits: false,
        }
    }
}

enum Ffn<W> {
    Dense { gate: W, up: W, down: W },
    Moe { router: W, gate: W, up: W, down: W },
}

struct Layer<W> {
    attn_norm: W,
    wq: W,
    wk: W,
    wv: W,
    wo: W,
    bias: Option<[W; 3]>,
    qk_norm: Option<[W; 2]>,
    attn_post_norm: Option<W>,
    ffn_norm: W,
    ffn: Ffn<W>,
    ffn_post_norm: Option<W>,
}

/// Per-step activation buffers, allocated once at the largest batch so their addresses never
/// change between steps.
struct Activations<B: Backend> {
    x: B::Buffer,
    xn: B::Buffer,
    q: B::Buffer,
    k: B::Buffer,
    v: B::Buffer,
    attn: B::Buffer,
    proj: B::Buffer,
    gate: B::Buffer,
    up: B::Buffer,
    router: B::Buffer,
    logits: B::Buffer,
}

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

/// A loaded model ready to run steps.
pub struct Model<B: Backend> {
    spec: ModelSpec,
    backend: B,
    embed: B::Weight,
    output_norm: B::Weight,
    /// `None` when the output projection is tied to the embedding.
    output: Option<B::Weight>,
    rope_factors: Option<B::Weight>,
    layers: Vec<Layer<B::Weight>>,
    kv: KvCache<B>,
    act: Activations<B>,
    options: ModelOptions,
    file_bytes: u64,
    /// Tokens in the last step (rows of the logits buffer with `all_logits`).
    last_n: usize,
}

struct Loader<'a, B: Backend> {
    file: &'a Arc<GgufFile>,
    backend: &'a mut B,
}

impl<B: Backend> Loader<'_, B> {
    fn optional(&mut self, name: &str, shape: &[usize]) -> Result<Option<B::Weight>> {
        let Some(info) = self.file.tensor(name) else {
            return Ok(None);
        };
        let found: Vec<usize> = info.dims.iter().map(|&d| d as usize).collect();
        let mut want = shape.to_vec();
        while want.len() < found.len() && found[want.len()] == 1 {
            want.push(1);
        }
        let mut f = found.clone();
        while f.len() > want.len() && f.last() == Some(&1) {
            f.pop();
        }
        if f != want {
            return Err(DecodeError::TensorShape {
                name: name.to_string(),
                expected: shape.to_vec(),
                found,
            });
        }
        let mut dims = [1usize; 3];
        for (d, &v) in dims.iter_mut().zip(&found) {
            *d = v;
        }
        // `load_weight` refuses a type the backends cannot read (`WeightSource::check_bytes`).
        let w = self.backend.load_weight(&WeightSource {
            name,
            format: info.ggml_type,
            dims,
            bytes: self.file.tensor_data(info),
            mapped: Some(MappedTensor {
                file: self.file,
                info,
            }),
        })?;
        Ok(Some(w))
    }

    fn required(&mut self, name: &str, shape: &[usize]) -> Result<B::Weight> {
        self.optional(name, shape)?
            .ok_or_else(|| DecodeError::MissingTensor {
                name: name.to_string(),
            })
    }
}

impl<B: Backend> Model<B> {
    /// Loads the weights of `file` into `backend` and allocates the cache and activations.
    pub fn load(file: &Arc<GgufFile>, mut backend: B, options: ModelOptions) -> Result<Model<B>> {
        let spec = ModelSpec::from_gguf(file)?;
        if options.max_batch == 0 || options.context == 0 {
            return Err(DecodeError::InvalidArgument(
                "context and batch size must be at least 1".into(),
            ));
        }
        let s = &spec;
        let (e, qd, kd, vd) = (s.n_embd, s.widths.q, s.widths.k, s.widths.v);
        let mut ld = Loader {
            file,
            backend: &mut backend,
        };
        let embed = ld.required("token_embd.weight", &[e, s.vocab])?;
        let output_norm = ld.required("output_norm.weight", &[e])?;
        let output = ld.optional("output.weight", &[e, s.vocab])?;
        let rope_factors = ld.optional("rope_freqs.weight", &[s.layers[0].rope.n_rot / 2])?;
        let mut layers = Vec::with_capacity(s.n_layers);
        for il in 0..s.n_layers {
            let n = |t: &str| format!("blk.{il}.{t}.weight");
            let b = |t: &str| format!("blk.{il}.{t}.bias");
            let bias = match ld.optional(&b("attn_q"), &[qd])? {
                Some(bq) => Some([
                    bq,
                    ld.required(&b("attn_k"), &[kd])?,
                    ld.required(&b("attn_v"), &[vd])?,
                ]),
                None => None,
            };
            let qk_norm = if s.qk_norm {
                Some([
                    ld.required(&n("attn_q_norm"), &[s.head_dim_k])?,
                    ld.required(&n("attn_k_norm"), &[s.head_dim_k])?,
                ])
            } else {
                None
            };
            let post = |ld: &mut Loader<'_, B>, t: &str| -> Result<Option<B::Weight>> {
                if s.sandwich_norms {
                    ld.required(&n(t), &[e]).map(Some)
                } else {
                    Ok(None)
                }
            };
            let ffn = if s.is_moe() {
                let (x, f) = (s.n_expert, s.n_ff_expert);
                Ffn::Moe {
                    router: ld.required(&n("ffn_gate_inp"), &[e, x])?,
                    gate: ld.required(&n("ffn_gate_exps"), &[e, f, x])?,
                    up: ld.required(&n("ffn_up_exps"), &[e, f, x])?,
                    down: ld.required(&n("ffn_down_exps"), &[f, e, x])?,
                }
            } else {
                Ffn::Dense {
                    gate: ld.required(&n("ffn_gate"), &[e, s.n_ff])?,
                    up: ld.required(&n("ffn_up"), &[e, s.n_ff])?,
                    down: ld.required(&n("ffn_down"), &[s.n_ff, e])?,
                }
            };
            layers.push(Layer {
                attn_norm: ld.required(&n("attn_norm"), &[e])?,
                wq: ld.required(&n("attn_q"), &[e, qd])?,
                wk: ld.required(&n("attn_k"), &[e, kd])?,
                wv: ld.required(&n("attn_v"), &[e, vd])?,
                wo: ld.required(&n("attn_output"), &[s.widths.o, e])?,
                bias,
                qk_norm,
                attn_post_norm: post(&mut ld, "post_attention_norm")?,
                ffn_norm: ld.required(&n("ffn_norm"), &[e])?,
                ffn,
                ffn_post_norm: post(&mut ld, "post_ffw_norm")?,
            });
        }
        let context = options.context.min(s.context_length.max(1));
        let slots = s
            .layers
            .iter()
            .map(|l| match l.window {
                Some(w) => context.min(w.saturating_add(options.max_batch - 1)),
                None => context,
            })
            .collect();
        let kv = KvCache::new(&mut backend, slots, context, kd, vd)?;
        let mb = options.max_batch;
        // MoE layers have no dense FFN here, so feed_forward_length sizes nothing for them.
        let ff = if s.is_moe() { s.n_ff_expert } else { s.n_ff };
        let logit_rows = if options.all_logits { mb } else { 1 };
        let mut a = |what: &str, rows: usize, width: usize| {
            let n = rows
                .checked_mul(width)
                .ok_or_else(|| DecodeError::Allocation {
                    what: format!("the {what} activations"),
                    reason: format!("{rows} rows of {width} values overflow"),
                })?;
            backend.alloc(MemoryTag::Activations, n)
        };
        let act = Activations {
            x: a("residual", mb, e)?,
            xn: a("normalized", mb, e.max(qd))?,
            q: a("query", mb, qd)?,
            k: a("key", mb, kd)?,
            v: a("value", mb, vd)?,
            attn: a("attention", mb, s.widths.o)?,
            proj: a("projection", mb, e)?,
            gate: a("FFN gate", mb, ff)?,
            up: a("FFN up", mb, ff)?,
            router: a("router", mb, s.n_expert.max(1))?,
            logits: a("logits", logit_rows, s.vocab)?,
        };
        let bounds = StepBounds {
            max_tokens: mb,
            decode_attention: s
                .layers
                .iter()
                .zip(&kv.slots)
                .map(|(l, &slots)| Attention {
                    n_tokens: 1,
                    n_head: s.n_head,
                    n_head_kv: s.n_head_kv,
                    head_dim_k: s.head_dim_k,
                    head_dim_v: s.head_dim_v,
                    scale: s.attn_scale,
                    window: l.window,
                    slots,
                })
                .collect(),
            moe: s.is_moe().then_some(MoeShape {
                rows: mb,
                n_embd: e,
                n_ff: s.n_ff_expert,
                n_expert: s.n_expert,
                k: s.n_expert_used,
                act: s.gate,
            }),
        };
        // The buffers matrix products read: the normalized rows (Q/K/V, gate/up, router,
        // output), the attention output and, in a dense FFN, the gated activations.
        let mut matmul_inputs = vec![(&act.xn, e.max(qd)), (&act.attn, s.widths.o)];
        if !s.is_moe() {
            matmul_inputs.push((&act.gate, ff));
        }
        backend.reserve_workspace(&bounds, &matmul_inputs)?;
        let file_bytes = file.tensors().iter().map(|t| t.n_bytes).sum();
        Ok(Model {
            spec,
            backend,
            embed,
            output_norm,
            output,
            rope_factors,
            layers,
            kv,
            act,
            options: ModelOptions { context, ..options },
            file_bytes,
            last_n: 0,
        })
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    pub fn options(&self) -> &ModelOptions {
        &self.options
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, for switches that do not change the model's buffers (profiling, peak
    /// counters).
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Positions already in the KV cache.
    pub fn position(&self) -> usize {
        self.kv.len()
    }

    /// Empties the KV cache so the next tokens start a new sequence at position 0.
    pub fn reset(&mut self) {
        self.kv.clear();
    }

    /// Bytes in use, per tag.
    pub fn memory(&self) -> MemoryReport {
        self.backend.memory()
    }

    /// Total bytes of weight tensors in the file.
    pub fn file_weight_bytes(&self) -> u64 {
        self.file_bytes
    }

    /// Appends `tokens` to the sequence. Afterwards the logits of the last token (or of every
    /// token of the last chunk with `all_logits`) are in the logits buffer.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<()> {
        let needed = self.kv.len() + tokens.len();
        if needed > self.kv.capacity() {
            return Err(DecodeError::ContextFull {
                needed,
                capacity: self.kv.capacity(),
            });
        }
        for chunk in tokens.chunks(self.options.max_batch) {
            self.step(chunk)?;
        }
        Ok(())
    }

    /// Logits of the last token processed, copied to the host.
    pub fn last_logits(&mut self, out: &mut Vec<f32>) -> Result<()> {
        out.resize(self.spec.vocab, 0.0);
        let row = if self.options.all_logits {
            self.last_batch_len().saturating_sub(1)
        } else {
            0
        };
        self.backend
            .read(&self.act.logits, row * self.spec.vocab, out)
    }

    /// Index of the largest logit of the last token, computed on the backend.
    pub fn last_argmax(&mut self) -> Result<u32> {
        let row = if self.options.all_logits {
            self.last_batch_len().saturating_sub(1)
        } else {
            0
        };
        self.backend.argmax(&self.act.logits, row, self.spec.vocab)
    }

    /// A token sampled from the last token's logits on the backend (see [`Backend::sample`]),
    /// or `None` where the backend does not sample.
    pub fn last_sample(
        &mut self,
        config: &crate::sampler::SamplerConfig,
        draw: f64,
    ) -> Result<Option<u32>> {
        let row = if self.options.all_logits {
            self.last_batch_len().saturating_sub(1)
        } else {
            0
        };
        self.backend
            .sample(&self.act.logits, row, self.spec.vocab, config, draw)
    }

    fn last_batch_len(&self) -> usize {
        self.last_n
    }

    /// Logits at every position of `tokens` from the current position on (needs
    /// `all_logits`), as `[tokens.len()][vocab]`.
    pub fn forward_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if !self.options.all_logits {
            return Err(DecodeError::InvalidArgument(
                "forward_all_logits needs a model loaded with all_logits".into(),
            ));
        }
        let v = self.spec.vocab;
        let mut out = vec![0.0; tokens.len() * v];
        let mut done = 0;
        for chunk in tokens.chunks(self.options.max_batch) {
            self.forward(chunk)?;
            self.backend.read(
                &self.act.logits,
                0,
                &mut out[done * v..(done + chunk.len()) * v],
            )?;
            done += chunk.len();
        }
        Ok(out)
    }

    fn step(&mut self, tokens: &[u32]) -> Result<()> {
        let n = tokens.len();
        let pos0 = self.kv.len();
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.spec.vocab) {
            return Err(DecodeError::TokenOutOfRange {
                id,
                vocab: self.spec.vocab,
            });
        }
        let Model {
            spec: s,
            backend,
            embed,
            output_norm,
            output,
            rope_factors,
            layers,
            kv,
            act: a,
            options,
            ..
        } = self;
        let key = StepKey {
            n_tokens: n,
            all_logits: options.all_logits,
        };
        backend.begin_step(pos0, tokens)?;
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
                let slots = kv.slots[il];
                let dest = KvDestination {
                    k_cache: &mut kv.k[il],
                    v_cache: &mut kv.v[il],
                    k_dim: kd,
                    v_dim: vd,
                    slots,
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
                    slots,
                };
                be.attention(&a.q, &kv.k[il], &kv.v[il], &mut a.attn, &shape)?;
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
            if options.all_logits || n == 1 {
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
            } else {
                // Only the last row's logits: the whole residual, then one row's norm.
                if let Pending::Output(post_norm) = pending {
                    if let Some(w) = post_norm {
                        be.rms_norm_inplace(&mut a.proj, w, n, e, s.eps)?;
                    }
                    be.add(&mut a.x, &a.proj, n * e)?;
                }
                be.copy_row(&a.x, n - 1, &mut a.proj, 0, e)?;
                be.rms_norm(&a.proj, output_norm, &mut a.xn, 1, e, s.eps)?;
                be.matmul(out_w, &a.xn, &mut a.logits, 1)?;
            }
            Ok(())
        })?;
        self.kv.set_len(pos0 + n);
        self.last_n = n;
        Ok(())
    }
}
