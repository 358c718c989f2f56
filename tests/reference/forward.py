#!/usr/bin/env python3
"""Independent numpy forward pass for GGUF decoder models (llama, qwen3, qwen3moe, gemma3).

The Rust decode crate is checked against this script. It reads the GGUF with gguf-py, dequantizes
every weight once with `gguf.quants.dequantize`, and evaluates the transformer in float32 (norms,
softmax and RoPE angles in float64). Every modelling convention it adopts is written down in
tests/reference/README.md; that file is the spec.

CLI:
  forward.py --model M --tokens 2,1234,56 --out logits.npy   # float32 [n_tokens, vocab]
  forward.py --model M --tokens 2,1234,56 --greedy 16        # prints {"tokens": [...]}
  forward.py ... --greedy 16 --margins                         # adds "margins": top-1 minus top-2 logit per step
  forward.py ... --query-pre-attn-scalar 128                   # attention scale 1/sqrt(128) instead of the model's
  forward.py ... --context 64                                  # positions per sequence (LongRoPE's choice)
"""

from __future__ import annotations

import os
import sys

# The matmuls here are small (often one row); BLAS threads only add contention on a busy CI
# machine, where they made single-token steps ~8x slower. Callers may still override this.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import math
from dataclasses import dataclass

import struct

import numpy as np
from gguf.quants import dequantize

from ggufread import GGUFFile, GGUFFormatError

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3")
_MISSING = object()


class ReferenceError(Exception):
    """A model file this reference cannot evaluate, with the reason and the fix."""


# --------------------------------------------------------------------------------------------
# GGUF access
# --------------------------------------------------------------------------------------------


class GGUFModel:
    """Metadata and lazily dequantized float32 weights of one GGUF file."""

    def __init__(self, path: str):
        try:
            self.file = GGUFFile(path)
        except FileNotFoundError:
            raise ReferenceError(f"model file {path!r} does not exist; pass an existing .gguf")
        except (GGUFFormatError, ValueError, struct.error) as e:
            raise ReferenceError(f"cannot parse {path!r} as GGUF ({e}); is it a GGUF v2/v3 file?")
        self.path = path
        self.tensors = self.file.tensors
        self._weights: dict[str, np.ndarray] = {}

    def meta(self, key: str, default=_MISSING):
        if key not in self.file.fields:
            if default is _MISSING:
                raise ReferenceError(f"metadata key {key!r} is missing from {self.path}")
            return default
        return self.file.fields[key]

    def has(self, name: str) -> bool:
        return name in self.tensors

    def weight(self, name: str) -> np.ndarray:
        """The tensor as float32 in numpy (row-major) order, i.e. GGUF dims reversed.

        A GGUF matrix with ne = [n_in, n_out] becomes an array of shape (n_out, n_in), so a
        linear layer is `x @ W.T`. Each tensor is dequantized once per process.
        """
        w = self._weights.get(name)
        if w is None:
            t = self.tensors.get(name)
            if t is None:
                raise ReferenceError(f"tensor {name!r} is missing from {self.path}")
            try:
                w = dequantize(t.data, t.qtype)
            except NotImplementedError:
                raise ReferenceError(
                    f"tensor {name!r} has type {t.qtype.name}, which gguf-py cannot dequantize"
                )
            w = np.ascontiguousarray(w, dtype=np.float32).reshape(tuple(reversed(t.ne)))
            self._weights[name] = w
        return w


# --------------------------------------------------------------------------------------------
# Hyperparameters
# --------------------------------------------------------------------------------------------


@dataclass
class Config:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int  # key/query head size
    head_dim_v: int
    eps: float
    n_rot: int
    rope_neox: bool
    rope_base: float
    rope_base_swa: float
    rope_freq_scale: float
    sliding_window: int  # 0 = none
    swa_layers: list  # bool per layer: True = sliding-window (local) layer
    attn_scale: float
    embd_scale: float
    qk_norm: bool
    sandwich_norm: bool  # gemma: post_attention_norm / post_ffw_norm
    gelu_ffn: bool  # gemma: GELU(tanh) gate instead of SiLU
    expert_used: int
    expert_norm: bool
    attn_softcap: float  # 0 = none
    final_softcap: float  # 0 = none
    # Phi-3's LongRoPE: (original context, attention factor), or None.
    long_rope: tuple | None
    context_length: int
    vocab: int
    eos: int | None


def _int_meta(m: GGUFModel, key: str, default=_MISSING) -> int:
    v = m.meta(key, default)
    if isinstance(v, list):
        if len(set(v)) != 1:
            raise ReferenceError(f"{key} varies per layer ({v}); this reference needs one value")
        v = v[0]
    return int(v)


# Gemma 3 27B is the one size whose query_pre_attn_scalar is n_embd / n_head (5376 / 32 = 168)
# instead of the head size (128). GGUF has no key for it; the 27B model is recognised by its
# 62 layers, the only Gemma 3 size with that depth.
GEMMA3_27B_LAYERS = 62
# Gemma 2 27B likewise (4608 / 32 = 144 against heads of 128), recognised by its 46 layers.
GEMMA2_27B_LAYERS = 46


def query_pre_attn_scalar(arch: str, n_layer: int, n_embd: int, n_head: int, head_dim: int) -> int:
    """The number whose inverse square root scales attention scores."""
    if (arch, n_layer) in (("gemma3", GEMMA3_27B_LAYERS), ("gemma2", GEMMA2_27B_LAYERS)):
        return n_embd // n_head
    return head_dim


def load_config(m: GGUFModel) -> Config:
    arch = m.meta("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ReferenceError(
            f"architecture {arch!r} is not supported; this reference handles {', '.join(SUPPORTED_ARCHS)}"
        )
    a = arch + "."
    n_embd = _int_meta(m, a + "embedding_length")
    n_head = _int_meta(m, a + "attention.head_count")
    n_head_kv = _int_meta(m, a + "attention.head_count_kv", n_head)
    head_dim = _int_meta(m, a + "attention.key_length", n_embd // n_head)
    head_dim_v = _int_meta(m, a + "attention.value_length", head_dim)
    n_layer = _int_meta(m, a + "block_count")
    if n_head % n_head_kv != 0:
        raise ReferenceError(f"head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
    n_rot = _int_meta(m, a + "rope.dimension_count", head_dim)
    if n_rot % 2 or n_rot > head_dim:
        raise ReferenceError(f"rope.dimension_count {n_rot} must be even and <= head size {head_dim}")

    rope_base = float(m.meta(a + "rope.freq_base", 10000.0))
    scaling = m.meta(a + "rope.scaling.type", "none")
    freq_scale = 1.0
    if scaling == "linear":
        freq_scale = 1.0 / float(m.meta(a + "rope.scaling.factor"))
    elif scaling not in ("none", ""):
        raise ReferenceError(f"rope scaling type {scaling!r} is not supported (only none and linear)")

    is_gemma = arch in ("gemma2", "gemma3")
    is_gemma2 = arch == "gemma2"
    # Gemma 2: a window of 4096 and every other layer sliding unless the file says otherwise;
    # Gemma 3 must state its window and has five sliding layers to a global one.
    sliding_window = (_int_meta(m, a + "attention.sliding_window", 4096 if is_gemma2 else _MISSING)
                      if is_gemma else 0)
    if is_gemma:
        pattern = m.meta(a + "attention.sliding_window_pattern", 2 if is_gemma2 else 6)
        if isinstance(pattern, list):
            if len(pattern) != n_layer:
                raise ReferenceError(f"sliding_window_pattern has {len(pattern)} entries for {n_layer} layers")
            swa_layers = [bool(x) for x in pattern]
        else:
            # Period n: the last layer of every n is global; n = 0 makes every layer local.
            period = int(pattern)
            swa_layers = [period == 0 or (il % period) < period - 1 for il in range(n_layer)]
        # Gemma 2's local layers share the global base; Gemma 3's use 10 000.
        rope_base_swa = float(m.meta(a + "rope.freq_base_swa", rope_base if is_gemma2 else 10000.0))
    else:
        swa_layers = [False] * n_layer
        rope_base_swa = rope_base

    long_rope = None
    if m.has("rope_factors_long.weight"):
        if not m.has("rope_factors_short.weight"):
            raise ReferenceError("rope_factors_long.weight without rope_factors_short.weight")
        long_rope = (_int_meta(m, a + "rope.scaling.original_context_length", _int_meta(m, a + "context_length")),
                     float(m.meta(a + "rope.scaling.attn_factor", 1.0)))
    if not m.has("token_embd.weight"):
        raise ReferenceError("tensor 'token_embd.weight' is missing")
    vocab = m.tensors["token_embd.weight"].ne[1]
    eos = m.meta("tokenizer.ggml.eos_token_id", None)

    return Config(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        eps=float(m.meta(a + "attention.layer_norm_rms_epsilon", 1e-5 if not is_gemma else 1e-6)),
        n_rot=n_rot,
        rope_neox=arch != "llama",
        rope_base=rope_base,
        rope_base_swa=rope_base_swa,
        rope_freq_scale=freq_scale,
        sliding_window=sliding_window,
        swa_layers=swa_layers,
        attn_scale=1.0 / math.sqrt(query_pre_attn_scalar(arch, n_layer, n_embd, n_head, head_dim)),
        embd_scale=math.sqrt(n_embd) if is_gemma else 1.0,
        qk_norm=arch in ("qwen3", "qwen3moe", "gemma3"),
        sandwich_norm=is_gemma,
        gelu_ffn=is_gemma,
        expert_used=_int_meta(m, a + "expert_used_count", 0),
        expert_norm=bool(m.meta(a + "expert_weights_norm", True)),
        # Gemma 2 caps at 50 and 30 when the file does not say (every released Gemma 2 does).
        attn_softcap=float(m.meta(a + "attn_logit_softcapping", 50.0 if is_gemma2 else 0.0) or 0.0),
        final_softcap=float(m.meta(a + "final_logit_softcapping", 30.0 if is_gemma2 else 0.0) or 0.0),
        long_rope=long_rope,
        context_length=_int_meta(m, a + "context_length"),
        vocab=int(vocab),
        eos=None if eos is None else int(eos),
    )


# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis, computed in float64."""
    x64 = x.astype(np.float64)
    inv = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    return (x64 * inv * w.astype(np.float64)).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def softmax64(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)


def rope(x: np.ndarray, pos: np.ndarray, cfg: Config, base: float, freq_scale: float,
         freq_factors: np.ndarray | None, mscale: float = 1.0) -> np.ndarray:
    """Rotate the first n_rot dims of each head. x: [n_tok, n_heads, head_dim], pos: [n_tok].

    Pair i (0 <= i < n_rot/2) turns by angle pos * freq_scale * base^(-2i/n_rot) / factor[i],
    and the rotated dims are multiplied by mscale (LongRoPE's attention factor).
    NeoX layout pairs dims (i, i + n_rot/2); the normal (GPT-J) layout pairs dims (2i, 2i+1).
    """
    half = cfg.n_rot // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / cfg.n_rot)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.astype(np.float64)
    ang = pos.astype(np.float64)[:, None] * freq_scale * inv_freq[None, :]  # [n_tok, half]
    cos = mscale * np.cos(ang)[:, None, :]
    sin = mscale * np.sin(ang)[:, None, :]
    out = x.astype(np.float64).copy()
    if cfg.rope_neox:
        a = out[..., :half].copy()
        b = out[..., half:cfg.n_rot].copy()
        out[..., :half] = a * cos - b * sin
        out[..., half:cfg.n_rot] = a * sin + b * cos
    else:
        a = out[..., 0:cfg.n_rot:2].copy()
        b = out[..., 1:cfg.n_rot:2].copy()
        out[..., 0:cfg.n_rot:2] = a * cos - b * sin
        out[..., 1:cfg.n_rot:2] = a * sin + b * cos
    return out.astype(np.float32)


def linear(m: GGUFModel, x: np.ndarray, name: str) -> np.ndarray:
    y = x @ m.weight(name + ".weight").T
    if m.has(name + ".bias"):
        y = y + m.weight(name + ".bias")
    return y


# --------------------------------------------------------------------------------------------
# The transformer
# --------------------------------------------------------------------------------------------


class Transformer:
    """Causal decoder with a per-layer K/V cache (positions start at 0)."""

    def __init__(self, m: GGUFModel, query_pre_attn_scalar: int | None = None,
                 context: int | None = None):
        """context: positions per sequence, which picks LongRoPE's factors (llama.cpp's n_ctx;
        its default, the trained context length, here too)."""
        self.m = m
        self.cfg = load_config(m)
        if query_pre_attn_scalar is not None:
            self.cfg.attn_scale = 1.0 / math.sqrt(query_pre_attn_scalar)
        self.context = self.cfg.context_length if context is None else context
        self.reset()

    def reset(self):
        self.k_cache = [np.zeros((0, self.cfg.n_head_kv, self.cfg.head_dim), np.float32)
                        for _ in range(self.cfg.n_layer)]
        self.v_cache = [np.zeros((0, self.cfg.n_head_kv, self.cfg.head_dim_v), np.float32)
                        for _ in range(self.cfg.n_layer)]

    @property
    def n_past(self) -> int:
        return self.k_cache[0].shape[0]

    def attention(self, il: int, h: np.ndarray, pos: np.ndarray) -> np.ndarray:
        cfg, m = self.cfg, self.m
        p = f"blk.{il}."
        n = h.shape[0]
        if m.has(p + "attn_qkv.weight"):
            # Phi-3: one product, its outputs Q, then K, then V.
            qkv = linear(m, h, p + "attn_qkv")
            nq, nk = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
            q = qkv[:, :nq].reshape(n, cfg.n_head, cfg.head_dim)
            k = qkv[:, nq:nq + nk].reshape(n, cfg.n_head_kv, cfg.head_dim)
            v = qkv[:, nq + nk:].reshape(n, cfg.n_head_kv, cfg.head_dim_v)
        else:
            q = linear(m, h, p + "attn_q").reshape(n, cfg.n_head, cfg.head_dim)
            k = linear(m, h, p + "attn_k").reshape(n, cfg.n_head_kv, cfg.head_dim)
            v = linear(m, h, p + "attn_v").reshape(n, cfg.n_head_kv, cfg.head_dim_v)
        if cfg.qk_norm:
            q = rms_norm(q, m.weight(p + "attn_q_norm.weight"), cfg.eps)
            k = rms_norm(k, m.weight(p + "attn_k_norm.weight"), cfg.eps)

        local = cfg.swa_layers[il]
        base = cfg.rope_base_swa if local else cfg.rope_base
        # Gemma 3 applies linear rope scaling to its global layers only.
        scale = 1.0 if local else cfg.rope_freq_scale
        factors = m.weight("rope_freqs.weight") if m.has("rope_freqs.weight") else None
        mscale = 1.0
        if cfg.long_rope is not None:
            original, mscale = cfg.long_rope
            factors = m.weight("rope_factors_long.weight" if self.context > original
                               else "rope_factors_short.weight")
        q = rope(q, pos, cfg, base, scale, factors, mscale)
        k = rope(k, pos, cfg, base, scale, factors, mscale)

        self.k_cache[il] = np.concatenate([self.k_cache[il], k], axis=0)
        self.v_cache[il] = np.concatenate([self.v_cache[il], v], axis=0)
        keys, vals = self.k_cache[il], self.v_cache[il]
        kpos = np.arange(keys.shape[0])

        group = cfg.n_head // cfg.n_head_kv
        kv_of_head = np.arange(cfg.n_head) // group
        kh = keys[:, kv_of_head, :]  # [T, n_head, hd]
        vh = vals[:, kv_of_head, :]
        scores = np.einsum("qhd,khd->hqk", q, kh).astype(np.float64) * cfg.attn_scale
        if cfg.attn_softcap:
            scores = cfg.attn_softcap * np.tanh(scores / cfg.attn_softcap)
        masked = kpos[None, :] > pos[:, None]
        if local and cfg.sliding_window:
            masked |= (pos[:, None] - kpos[None, :]) >= cfg.sliding_window
        scores = np.where(masked[None, :, :], -np.inf, scores)
        probs = softmax64(scores).astype(np.float32)
        out = np.einsum("hqk,khd->qhd", probs, vh).reshape(n, cfg.n_head * cfg.head_dim_v)
        return linear(m, out, p + "attn_output")

    def dense_ffn(self, il: int, h: np.ndarray) -> np.ndarray:
        p = f"blk.{il}."
        act = gelu_tanh if self.cfg.gelu_ffn else silu
        if self.m.has(p + "ffn_gate.weight"):
            g = linear(self.m, h, p + "ffn_gate")
            u = linear(self.m, h, p + "ffn_up")
        else:
            # Phi-3: gate and up in one product of twice the width, the gate's half first
            # (llama.cpp's SwiGLU on a single tensor).
            gu = linear(self.m, h, p + "ffn_up")
            g, u = np.split(gu, 2, axis=1)
        return linear(self.m, act(g) * u, p + "ffn_down")

    def moe_ffn(self, il: int, h: np.ndarray) -> np.ndarray:
        cfg, m = self.cfg, self.m
        p = f"blk.{il}."
        router = h @ m.weight(p + "ffn_gate_inp.weight").T  # [n, n_expert]
        n_expert = router.shape[1]
        k = cfg.expert_used
        if not 1 <= k <= n_expert:
            raise ReferenceError(f"expert_used_count {k} must be in 1..={n_expert} (layer {il})")
        probs = softmax64(router)
        gate_e = m.weight(p + "ffn_gate_exps.weight")  # [n_expert, n_ff, n_embd]
        up_e = m.weight(p + "ffn_up_exps.weight")
        down_e = m.weight(p + "ffn_down_exps.weight")  # [n_expert, n_embd, n_ff]
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            # Stable sort on -prob: ties go to the lower expert index.
            top = np.argsort(-probs[t], kind="stable")[:k]
            w = probs[t, top]
            if cfg.expert_norm:
                w = w / w.sum()
            acc = np.zeros(h.shape[1], np.float64)
            for e, we in zip(top, w):
                g = gate_e[e] @ h[t]
                u = up_e[e] @ h[t]
                acc += we * (down_e[e] @ (silu(g) * u)).astype(np.float64)
            out[t] = acc.astype(np.float32)
        return out

    def step(self, tokens, want_logits: str = "all") -> np.ndarray | None:
        """Feed `tokens` after the cached ones; return logits for 'all' positions, 'last' or 'none'."""
        cfg, m = self.cfg, self.m
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.size == 0:
            raise ReferenceError("no tokens given")
        if tokens.min() < 0 or tokens.max() >= cfg.vocab:
            bad = [int(t) for t in tokens if t < 0 or t >= cfg.vocab]
            raise ReferenceError(f"token ids {bad} are outside the vocabulary 0..{cfg.vocab - 1}")
        pos = np.arange(self.n_past, self.n_past + tokens.size)
        x = m.weight("token_embd.weight")[tokens].astype(np.float32) * np.float32(cfg.embd_scale)

        for il in range(cfg.n_layer):
            p = f"blk.{il}."
            h = rms_norm(x, m.weight(p + "attn_norm.weight"), cfg.eps)
            a = self.attention(il, h, pos)
            if cfg.sandwich_norm:
                a = rms_norm(a, m.weight(p + "post_attention_norm.weight"), cfg.eps)
            x = x + a
            h = rms_norm(x, m.weight(p + "ffn_norm.weight"), cfg.eps)
            if m.has(p + "ffn_gate_inp.weight"):
                f = self.moe_ffn(il, h)
            else:
                f = self.dense_ffn(il, h)
            if cfg.sandwich_norm:
                f = rms_norm(f, m.weight(p + "post_ffw_norm.weight"), cfg.eps)
            x = x + f

        if want_logits == "none":
            return None
        if want_logits == "last":
            x = x[-1:]
        x = rms_norm(x, m.weight("output_norm.weight"), cfg.eps)
        head = "output.weight" if m.has("output.weight") else "token_embd.weight"
        logits = x @ m.weight(head).T
        if cfg.final_softcap:
            logits = (cfg.final_softcap * np.tanh(logits.astype(np.float64) / cfg.final_softcap))
        return logits.astype(np.float32)

    def logits(self, tokens) -> np.ndarray:
        """Logits at every position of `tokens`, computed from scratch in one pass."""
        self.reset()
        return self.step(tokens, "all")

    def greedy(self, tokens, n_new: int, margins: list | None = None) -> list[int]:
        """Argmax continuation; if `margins` is a list, append each step's top-1 minus top-2 logit."""
        self.reset()
        logits = self.step(tokens, "last")
        out: list[int] = []
        for _ in range(n_new):
            row = logits[-1]
            nxt = int(np.argmax(row))  # first maximal index on ties
            if margins is not None:
                top2 = np.partition(row, -2)[-2:]
                margins.append(float(top2[1] - top2[0]))
            out.append(nxt)
            if self.cfg.eos is not None and nxt == self.cfg.eos:
                break
            if len(out) == n_new:
                break
            logits = self.step([nxt], "last")
        return out


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def parse_ids(s: str) -> list[int]:
    try:
        ids = [int(x) for x in s.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise ReferenceError(f"--tokens {s!r} is not a comma-separated list of integers, e.g. 2,1234,56")
    if not ids:
        raise ReferenceError("--tokens is empty; give at least one token id")
    return ids


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="path to a .gguf file")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids (no BOS is added)")
    ap.add_argument("--out", help="write float32 logits [n_tokens, vocab] to this .npy file")
    ap.add_argument("--greedy", type=int, metavar="N", help="print N greedily generated ids as JSON")
    ap.add_argument("--margins", action="store_true",
                    help="with --greedy, also print each step's top-1 minus top-2 logit as \"margins\"")
    ap.add_argument("--query-pre-attn-scalar", type=int, metavar="S",
                    help="scale attention scores by 1/sqrt(S) instead of the model's own scale "
                         "(tests use it to show a wrong scale is detected)")
    ap.add_argument("--context", type=int, metavar="N",
                    help="positions per sequence, as a run would set them: LongRoPE models turn by "
                         "their long factors beyond the original context (default: the trained context)")
    args = ap.parse_args(argv)
    if (args.out is None) == (args.greedy is None):
        ap.error("give exactly one of --out or --greedy")
    if args.greedy is not None and args.greedy < 1:
        ap.error("--greedy must be at least 1")
    if args.query_pre_attn_scalar is not None and args.query_pre_attn_scalar < 1:
        ap.error("--query-pre-attn-scalar must be at least 1")
    if args.context is not None and args.context < 1:
        ap.error("--context must be at least 1")
    try:
        ids = parse_ids(args.tokens)
        model = Transformer(GGUFModel(args.model), args.query_pre_attn_scalar, args.context)
        if args.out is not None:
            np.save(args.out, model.logits(ids))
        else:
            margins: list | None = [] if args.margins else None
            result = {"tokens": model.greedy(ids, args.greedy, margins)}
            if margins is not None:
                result["margins"] = margins
            print(json.dumps(result))
    except ReferenceError as e:
        print(f"forward.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
