//! A decoder model over a [`Backend`]: its weights, loaded once and shared by every
//! [`crate::context::Context`] that runs over it, and the forward pass of a step batch
//! (`forward.rs`) shared by every architecture, with the differences taken from [`ModelSpec`].

mod consistency;
mod forward;
mod spec;
pub mod tensor_parallel;

pub use consistency::AttentionWidths;
pub use spec::{query_pre_attn_scalar, LayerSpec, ModelSpec, GEMMA3_27B_LAYERS};
pub use tensor_parallel::Shard;
use tensor_parallel::{bias_split, output_split, LayerSplits, Split};

use crate::backend::{Backend, MappedTensor, WeightSource};
use crate::error::{DecodeError, Result};
use gguf_loader::GgufFile;
use std::sync::Arc;

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

/// The per-dimension frequency factors RoPE divides by, where the model has them.
enum RopeFactors<W> {
    None,
    /// Llama 3.1's `rope_freqs.weight`, for every context.
    Fixed(W),
    /// Phi-3's LongRoPE pair, chosen by the context's length ([`spec::LongRope`]).
    ByContext {
        long: W,
        short: W,
    },
}

impl<W> RopeFactors<W> {
    /// The factors a context of `positions` per sequence turns by.
    fn for_context(&self, spec: &ModelSpec, positions: usize) -> Option<&W> {
        match self {
            RopeFactors::None => None,
            RopeFactors::Fixed(w) => Some(w),
            RopeFactors::ByContext { long, short } => {
                let long_context = spec.long_rope.is_some_and(|l| l.is_long(positions));
                Some(if long_context { long } else { short })
            }
        }
    }
}

/// A loaded model: its description and its weights on a backend. It is read-only once
/// loaded, so it is shared: every [`crate::context::Context`] on the same backend runs over it.
pub struct Model<B: Backend> {
    spec: ModelSpec,
    embed: B::Weight,
    output_norm: B::Weight,
    /// `None` when the output projection is tied to the embedding.
    output: Option<B::Weight>,
    /// Whether this rank holds only its part of the vocabulary's rows of `output`
    /// ([`tensor_parallel::output_split`]), whose logits an all-gather joins.
    output_split: bool,
    rope_factors: RopeFactors<B::Weight>,
    layers: Vec<Layer<B::Weight>>,
    file_bytes: u64,
    /// This model's part of a tensor-parallel split (whole on one rank).
    shard: Shard,
}

struct Loader<'a, B: Backend> {
    file: &'a Arc<GgufFile>,
    backend: &'a mut B,
}

impl<B: Backend> Loader<'_, B> {
    fn optional(&mut self, name: &str, shape: &[usize]) -> Result<Option<B::Weight>> {
        self.load(name, shape, false, &Split::Whole)
    }

    /// Loads `split`'s part of `name`, of the whole model's `shape`, when the file has it;
    /// `lookup_only` marks a table the model only looks rows up in
    /// ([`WeightSource::lookup_only`]).
    fn load(
        &mut self,
        name: &str,
        shape: &[usize],
        lookup_only: bool,
        split: &Split,
    ) -> Result<Option<B::Weight>> {
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
        let bytes = self.file.tensor_data(info);
        // `load_weight` refuses a type the backends cannot read (`WeightSource::check_bytes`).
        let w = match split {
            Split::Whole => self.backend.load_weight(&WeightSource {
                name,
                format: info.ggml_type,
                dims,
                bytes,
                mapped: Some(MappedTensor {
                    file: self.file,
                    info,
                }),
                lookup_only,
            })?,
            // A part is bytes of its own, which the backend copies.
            part => {
                let (bytes, dims) =
                    tensor_parallel::slice(name, info.ggml_type, dims, bytes, part)?;
                self.backend.load_weight(&WeightSource {
                    name,
                    format: info.ggml_type,
                    dims,
                    bytes: &bytes,
                    mapped: None,
                    lookup_only,
                })?
            }
        };
        Ok(Some(w))
    }

    fn required(&mut self, name: &str, shape: &[usize]) -> Result<B::Weight> {
        self.required_part(name, shape, &Split::Whole)
    }

    fn required_part(&mut self, name: &str, shape: &[usize], split: &Split) -> Result<B::Weight> {
        self.load(name, shape, false, split)?
            .ok_or_else(|| DecodeError::MissingTensor {
                name: name.to_string(),
            })
    }
}

impl<B: Backend> Model<B> {
    /// Loads the weights of `file` into `backend`. Contexts ([`crate::context::Context::new`]) then take the
    /// KV cache and activations for the bounds they run at.
    pub fn load(file: &Arc<GgufFile>, backend: &mut B) -> Result<Model<B>> {
        Model::load_with_progress(file, backend, &mut |_, _| {})
    }

    /// [`Model::load`], calling `progress(layers loaded, layers)` after each layer, so a
    /// command line can show how far a large model's load has come.
    pub fn load_with_progress(
        file: &Arc<GgufFile>,
        backend: &mut B,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Model<B>> {
        Model::load_shard(file, backend, Shard::whole(), progress)
    }

    /// `shard`'s part of the model of `file` for a tensor-parallel run ([`tensor_parallel`]):
    /// its spec has the rank's heads and feed-forward width, and its steps all-reduce the
    /// attention and feed-forward outputs through the backend's collective
    /// ([`Backend::all_reduce_sum`]).
    pub fn load_shard(
        file: &Arc<GgufFile>,
        backend: &mut B,
        shard: Shard,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Model<B>> {
        let whole = ModelSpec::from_gguf(file)?;
        let spec = tensor_parallel::shard_spec(&whole, shard)?;
        let splits = LayerSplits::new(&whole, shard);
        // Shapes are checked against the file's whole tensors, before a part is cut.
        let s = &whole;
        let (e, qd, kd, vd) = (s.n_embd, s.widths.q, s.widths.k, s.widths.v);
        // A part of a split is cut from its tensors as it loads, so only a whole model's sizes
        // are known ahead.
        if shard.ranks == 1 {
            let (weights, _) = crate::layout::weights::loaded_weights(file, &whole, shard)?;
            backend.reserve_weights(&weights)?;
        }
        let mut ld = Loader { file, backend };
        // Without an output projection the table is also the output's matrix (tied).
        let tied = file.tensor("output.weight").is_none();
        let embed = ld
            .load("token_embd.weight", &[e, s.vocab], !tied, &Split::Whole)?
            .ok_or_else(|| DecodeError::MissingTensor {
                name: "token_embd.weight".into(),
            })?;
        let output_norm = ld.required("output_norm.weight", &[e])?;
        let vocab_part = output_split(&whole, shard, !tied);
        let output_split = vocab_part != Split::Whole;
        let output = ld.load("output.weight", &[e, s.vocab], false, &vocab_part)?;
        let half_rot = [s.layers[0].rope.n_rot / 2];
        let rope_factors = match ld.optional("rope_freqs.weight", &half_rot)? {
            Some(w) => RopeFactors::Fixed(w),
            None if s.long_rope.is_some() => RopeFactors::ByContext {
                long: ld.required("rope_factors_long.weight", &half_rot)?,
                short: ld.required("rope_factors_short.weight", &half_rot)?,
            },
            None => RopeFactors::None,
        };
        let mut layers = Vec::with_capacity(s.n_layers);
        for il in 0..s.n_layers {
            let n = |t: &str| format!("blk.{il}.{t}.weight");
            let b = |t: &str| format!("blk.{il}.{t}.bias");
            let bias_q = ld.load(&b("attn_q"), &[qd], false, &bias_split(&splits.q))?;
            let bias = match bias_q {
                Some(bq) => Some([
                    bq,
                    ld.required_part(&b("attn_k"), &[kd], &bias_split(&splits.k))?,
                    ld.required_part(&b("attn_v"), &[vd], &bias_split(&splits.v))?,
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
                let (rows, cols) = (&splits.ff_rows, &splits.ff_cols);
                Ffn::Moe {
                    router: ld.required(&n("ffn_gate_inp"), &[e, x])?,
                    gate: ld.required_part(&n("ffn_gate_exps"), &[e, f, x], rows)?,
                    up: ld.required_part(&n("ffn_up_exps"), &[e, f, x], rows)?,
                    down: ld.required_part(&n("ffn_down_exps"), &[f, e, x], cols)?,
                }
            } else {
                let (rows, cols) = (&splits.ff_rows, &splits.ff_cols);
                Ffn::Dense {
                    gate: ld.required_part(&n("ffn_gate"), &[e, s.n_ff], rows)?,
                    up: ld.required_part(&n("ffn_up"), &[e, s.n_ff], rows)?,
                    down: ld.required_part(&n("ffn_down"), &[s.n_ff, e], cols)?,
                }
            };
            layers.push(Layer {
                attn_norm: ld.required(&n("attn_norm"), &[e])?,
                wq: ld.required_part(&n("attn_q"), &[e, qd], &splits.q)?,
                wk: ld.required_part(&n("attn_k"), &[e, kd], &splits.k)?,
                wv: ld.required_part(&n("attn_v"), &[e, vd], &splits.v)?,
                wo: ld.required_part(&n("attn_output"), &[s.widths.o, e], &splits.o)?,
                bias,
                qk_norm,
                attn_post_norm: post(&mut ld, "post_attention_norm")?,
                ffn_norm: ld.required(&n("ffn_norm"), &[e])?,
                ffn,
                ffn_post_norm: post(&mut ld, "post_ffw_norm")?,
            });
            progress(il + 1, s.n_layers);
        }
        let file_bytes = file.tensors().iter().map(|t| t.n_bytes).sum();
        Ok(Model {
            spec,
            embed,
            output_norm,
            output,
            output_split,
            rope_factors,
            layers,
            file_bytes,
            shard,
        })
    }

    /// This model's part of a tensor-parallel split.
    pub fn shard(&self) -> Shard {
        self.shard
    }

    /// Whether this rank holds only its part of the vocabulary's rows of the output
    /// projection (`tensor_parallel`): a split whose ranks divide the vocabulary, of a model
    /// whose output is not tied to its embedding.
    pub fn output_is_split(&self) -> bool {
        self.output_split
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Total bytes of weight tensors in the file.
    pub fn file_weight_bytes(&self) -> u64 {
        self.file_bytes
    }
}
