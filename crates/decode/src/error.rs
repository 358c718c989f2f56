//! The decoder's error type: every variant names what went wrong and what to do about it.

use std::path::PathBuf;

/// Errors from loading a model, tokenizing, or generating.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("could not read the model {path}: {source}")]
    Model {
        path: PathBuf,
        #[source]
        source: gguf_loader::GgufError,
    },
    #[error("the model file is not usable: {0}")]
    Gguf(#[from] gguf_loader::GgufError),
    #[error("tensor parallelism: {0}")]
    Collective(#[from] collective::CollectiveError),
    #[error("architecture '{name}' is not supported; supported are {supported}")]
    UnsupportedArchitecture { name: String, supported: String },
    #[error("tensor '{name}' is missing from the model; the file is incomplete or of another architecture")]
    MissingTensor { name: String },
    #[error(
        "tensor '{name}' has shape {found:?} but {expected:?} was expected from the model metadata"
    )]
    TensorShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("metadata {key} = {value} disagrees with the tensors in the file: {tensors}; the file's metadata is wrong or it was cut or edited")]
    Inconsistent {
        key: String,
        value: String,
        tensors: String,
    },
    #[error("cannot allocate {what}: {reason}; pass a smaller --ctx (or batch size)")]
    Allocation { what: String, reason: String },
    #[error("tensor '{name}' is stored as {ty}, which hipdecode cannot read (it reads {supported}); re-quantize the model to Q4_K_M, Q8_0, F16 or F32")]
    UnsupportedTensorType {
        name: String,
        ty: String,
        supported: String,
    },
    #[error("the tokenizer cannot be built: {0}")]
    Tokenizer(String),
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("the context is full: {needed} positions are needed but the KV cache holds {capacity}; pass a larger --ctx")]
    ContextFull { needed: usize, capacity: usize },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A `HIPDECODE_*` variable holds a value its knob does not accept.
    #[error(transparent)]
    Knob(#[from] knobs::KnobError),
    #[error("no usable GPU: {0}. Run with --device cpu, or see docs/install.md")]
    GpuUnavailable(String),
    /// A failure of the GPU runtime, a kernel launch or the device allocator.
    #[error("GPU: {0}")]
    Gpu(String),
    /// A row's logits hold NaN or infinity, so no token can be drawn from them. `culprit`
    /// comes from a re-run of the step that checked every op's output.
    #[error(
        "the logits are not finite at position {pos} (sequence {seq}, token {token}): \
         {culprit}. The model file holds NaN or infinite values there, or its activations \
         overflow; re-download or re-convert the model"
    )]
    NonFiniteLogits {
        seq: usize,
        pos: usize,
        token: u32,
        culprit: String,
    },
}

/// Result alias for this crate.
pub type Result<T, E = DecodeError> = std::result::Result<T, E>;
