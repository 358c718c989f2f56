//! The counts in a file's metadata checked against the tensors the file actually holds, before
//! anything is sized by them.
//!
//! Metadata is a handful of integers a crafted or damaged file can set to anything
//! (`block_count = 2^40`, head counts whose product overflows); tensor shapes are bounded by the
//! bytes really present, because the GGUF index only accepts tensors that lie inside the file.
//! So every count that sizes memory or a loop is either read from a tensor shape or must equal
//! one, and products of counts are computed with checked arithmetic. Counts no tensor states
//! (context length, sliding window) only ever cap other sizes; the allocations they feed are
//! fallible and report what they could not get.

use crate::error::{DecodeError, Result};
use gguf_loader::{GgufFile, ModelConfig};

/// Row widths of the attention projections, every product checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionWidths {
    /// `n_head * head_dim_k`: outputs of `attn_q`.
    pub q: usize,
    /// `n_head_kv * head_dim_k`: outputs of `attn_k`, one K cache row.
    pub k: usize,
    /// `n_head_kv * head_dim_v`: outputs of `attn_v`, one V cache row.
    pub v: usize,
    /// `n_head * head_dim_v`: inputs of `attn_output`.
    pub o: usize,
}

/// Checks `c` (read from `file` with keys prefixed `arch.`) against the tensor shapes and returns
/// the attention widths. Every mismatch names the key, its value and what the tensors say.
pub fn check(file: &GgufFile, arch: &str, c: &ModelConfig) -> Result<AttentionWidths> {
    let key = |k: &str| format!("{arch}.{k}");
    check_layer_count(file, &key("block_count"), c.n_layers)?;

    let embd = dims(file, "token_embd.weight")?;
    expect(&key("embedding_length"), c.n_embd, embd[0], || {
        format!("token_embd.weight has rows of {}", embd[0])
    })?;
    let vocab_key = match file.get(&key("vocab_size")) {
        Some(_) => key("vocab_size"),
        None => "tokenizer.ggml.tokens (its length)".to_string(),
    };
    expect(&vocab_key, c.vocab_size, embd[1], || {
        format!("token_embd.weight has {} rows, one per token", embd[1])
    })?;

    let heads = |k: &str, n: usize, d: &str, dim: usize| -> Result<usize> {
        n.checked_mul(dim).ok_or_else(|| {
            mismatch(
                &key(k),
                n,
                format!("{n} heads x {} {dim} overflows", key(d)),
            )
        })
    };
    let widths = AttentionWidths {
        q: heads(
            "attention.head_count",
            c.n_head,
            "attention.key_length",
            c.head_dim_k,
        )?,
        k: heads(
            "attention.head_count_kv",
            c.n_head_kv,
            "attention.key_length",
            c.head_dim_k,
        )?,
        v: heads(
            "attention.head_count_kv",
            c.n_head_kv,
            "attention.value_length",
            c.head_dim_v,
        )?,
        o: heads(
            "attention.head_count",
            c.n_head,
            "attention.value_length",
            c.head_dim_v,
        )?,
    };
    // The per-head size first, where a tensor states it alone, so a wrong head count is
    // reported as such rather than as a wrong product.
    if file.tensor("blk.0.attn_q_norm.weight").is_some() {
        let d = dims(file, "blk.0.attn_q_norm.weight")?[0];
        expect(&key("attention.key_length"), c.head_dim_k, d, || {
            format!("blk.0.attn_q_norm.weight normalizes heads of {d}")
        })?;
    }
    for (tensor, k, n, per_head, width) in [
        (
            "blk.0.attn_q.weight",
            "attention.head_count",
            c.n_head,
            c.head_dim_k,
            widths.q,
        ),
        (
            "blk.0.attn_k.weight",
            "attention.head_count_kv",
            c.n_head_kv,
            c.head_dim_k,
            widths.k,
        ),
        (
            "blk.0.attn_v.weight",
            "attention.value_length",
            c.head_dim_v,
            c.n_head_kv,
            widths.v,
        ),
    ] {
        let out = dims(file, tensor)?[1];
        if out != width {
            return Err(mismatch(
                &key(k),
                n,
                format!("{tensor} has {out} outputs, not {width} (this value x {per_head})"),
            ));
        }
    }
    if c.n_expert > 0 {
        let gate = dims(file, "blk.0.ffn_gate_exps.weight")?;
        let (f, x) = (gate[1], gate.get(2).copied().unwrap_or(1));
        expect(&key("expert_count"), c.n_expert, x, || {
            format!("blk.0.ffn_gate_exps.weight stacks {x} experts")
        })?;
        let ff = c.n_ff_expert.unwrap_or(c.n_ff);
        let ff_key = match c.n_ff_expert {
            Some(_) => key("expert_feed_forward_length"),
            None => key("feed_forward_length"),
        };
        expect(&ff_key, ff, f, || {
            format!("blk.0.ffn_gate_exps.weight has {f} outputs per expert")
        })?;
    } else {
        let gate = dims(file, "blk.0.ffn_gate.weight")?;
        expect(&key("feed_forward_length"), c.n_ff, gate[1], || {
            format!("blk.0.ffn_gate.weight has {} outputs", gate[1])
        })?;
    }
    Ok(widths)
}

/// A tensor's dims (at least two, missing ones 1), or the missing-tensor error.
fn dims(file: &GgufFile, name: &str) -> Result<Vec<usize>> {
    let info = file
        .tensor(name)
        .ok_or_else(|| DecodeError::MissingTensor {
            name: name.to_string(),
        })?;
    // The GGUF index accepted these dims only if their product's bytes lie in the file, so
    // each fits in usize on the 64-bit targets this crate builds for; saturate regardless.
    let mut d: Vec<usize> = info
        .dims
        .iter()
        .map(|&v| usize::try_from(v).unwrap_or(usize::MAX))
        .collect();
    d.resize(d.len().max(2), 1);
    Ok(d)
}

fn expect(key: &str, value: usize, found: usize, says: impl FnOnce() -> String) -> Result<()> {
    if value == found {
        return Ok(());
    }
    Err(mismatch(key, value, says()))
}

fn mismatch(key: &str, value: usize, tensors: String) -> DecodeError {
    DecodeError::Inconsistent {
        key: key.to_string(),
        value: value.to_string(),
        tensors,
    }
}

/// `block_count` must equal the number of layers whose tensors are present (`blk.0` up to
/// `blk.{n-1}`, each with its `attn_norm.weight`).
fn check_layer_count(file: &GgufFile, key: &str, n_layers: usize) -> Result<()> {
    let present = file
        .tensors()
        .iter()
        .filter_map(|t| {
            let rest = t.name.strip_prefix("blk.")?;
            rest.split('.').next()?.parse::<usize>().ok()
        })
        .max()
        .map_or(0, |last| last.saturating_add(1));
    let says = || match present {
        0 => "the file has no blk.* layer tensors".to_string(),
        n => format!(
            "the file has tensors for {n} layers (blk.0 to blk.{})",
            n - 1
        ),
    };
    expect(key, n_layers, present, says)?;
    // Every layer in between must be there too; the loader names the first missing tensor.
    if let Some(il) =
        (0..n_layers).find(|il| file.tensor(&format!("blk.{il}.attn_norm.weight")).is_none())
    {
        return Err(DecodeError::MissingTensor {
            name: format!("blk.{il}.attn_norm.weight"),
        });
    }
    Ok(())
}
