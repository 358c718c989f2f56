#!/usr/bin/env python3
"""Self-tests of the Python reference (forward.py, tokenizer_ref.py, ggufread.py).

Run: python3 tests/reference/test_reference.py [-k SUBSTRING]

Small GGUF files are written with gguf-py's GGUFWriter (random F32 and Q8_0 weights) and the
reference is checked against invariants and hand-written computations that do not go through
its code paths. When the real Gemma 3 270M file and the `cargo xtask synth-model` tiny-* files are
present (models dir = $HIPDECODE_MODELS_DIR or <workspace>/models), checks on them run too;
otherwise they print why they skip, or fail when HIPDECODE_REQUIRE_MODELS=1 (as under
`cargo xtask test`, which fetches and writes those models first).
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import json
import math
import subprocess
import tempfile
import traceback

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

import forward
from ggufread import GGUFFile
import tokenizer_ref as reftok

TMP = tempfile.mkdtemp(prefix="hipdecode-ref-")
RNG = np.random.default_rng(1234)


# --------------------------------------------------------------------------------------------
# Synthetic model writer
# --------------------------------------------------------------------------------------------


def byte_vocab():
    """A tiny gpt2-style vocabulary: the 256 byte symbols plus a few specials."""
    b2u = reftok.bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)] + ["<|bos|>", "<|eos|>"]
    types = [1] * 256 + [3, 3]
    return tokens, types


def write_model(path, arch, *, n_layer=2, n_embd=32, n_head=4, n_head_kv=2, head_dim=8, n_ff=48,
                n_expert=0, n_expert_used=0, sliding_window=0, swa_pattern=None, quant_q8=False,
                tied=False, eos=None, overrides=None, extra_meta=None):
    """Write a random model; returns the dict of float32 weights as written (dequantized view)."""
    tokens, types = byte_vocab()
    vocab = len(tokens)
    w = gguf.GGUFWriter(path, arch)
    a = arch + "."
    w.add_uint32(a + "block_count", n_layer)
    w.add_uint32(a + "embedding_length", n_embd)
    w.add_uint32(a + "feed_forward_length", n_ff)
    w.add_uint32(a + "attention.head_count", n_head)
    w.add_uint32(a + "attention.head_count_kv", n_head_kv)
    w.add_uint32(a + "attention.key_length", head_dim)
    w.add_uint32(a + "attention.value_length", head_dim)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(a + "rope.freq_base", 10000.0 if arch != "gemma3" else 1000000.0)
    w.add_uint32(a + "context_length", 256)
    if n_expert:
        w.add_uint32(a + "expert_count", n_expert)
        w.add_uint32(a + "expert_used_count", n_expert_used)
        w.add_uint32(a + "expert_feed_forward_length", n_ff)
    if sliding_window:
        w.add_uint32(a + "attention.sliding_window", sliding_window)
    if swa_pattern is not None:
        w.add_uint32(a + "attention.sliding_window_pattern", swa_pattern)
    for k, v in (extra_meta or {}).items():
        if isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_uint32(k, v)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([])
    w.add_bos_token_id(256)
    if eos is not None:
        w.add_eos_token_id(eos)

    def rnd(*shape, scale=None):
        scale = scale if scale is not None else 1.0 / math.sqrt(shape[-1])
        return (RNG.standard_normal(shape) * scale).astype(np.float32)

    def norm_w(n):
        return (1.0 + 0.2 * RNG.standard_normal(n)).astype(np.float32)

    weights = {"token_embd.weight": rnd(vocab, n_embd, scale=1.0), "output_norm.weight": norm_w(n_embd)}
    if not tied:
        weights["output.weight"] = rnd(vocab, n_embd)
    for il in range(n_layer):
        p = f"blk.{il}."
        weights[p + "attn_norm.weight"] = norm_w(n_embd)
        weights[p + "attn_q.weight"] = rnd(n_head * head_dim, n_embd)
        weights[p + "attn_k.weight"] = rnd(n_head_kv * head_dim, n_embd)
        weights[p + "attn_v.weight"] = rnd(n_head_kv * head_dim, n_embd)
        weights[p + "attn_output.weight"] = rnd(n_embd, n_head * head_dim)
        weights[p + "ffn_norm.weight"] = norm_w(n_embd)
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            weights[p + "attn_q_norm.weight"] = norm_w(head_dim)
            weights[p + "attn_k_norm.weight"] = norm_w(head_dim)
        if arch == "gemma3":
            weights[p + "post_attention_norm.weight"] = norm_w(n_embd)
            weights[p + "post_ffw_norm.weight"] = norm_w(n_embd)
        if n_expert:
            weights[p + "ffn_gate_inp.weight"] = rnd(n_expert, n_embd, scale=1.0)
            weights[p + "ffn_gate_exps.weight"] = rnd(n_expert, n_ff, n_embd)
            weights[p + "ffn_up_exps.weight"] = rnd(n_expert, n_ff, n_embd)
            weights[p + "ffn_down_exps.weight"] = rnd(n_expert, n_embd, n_ff)
        else:
            weights[p + "ffn_gate.weight"] = rnd(n_ff, n_embd)
            weights[p + "ffn_up.weight"] = rnd(n_ff, n_embd)
            weights[p + "ffn_down.weight"] = rnd(n_embd, n_ff)
    weights.update(overrides or {})

    written = {}
    for name, t in weights.items():
        if quant_q8 and t.ndim >= 2 and t.shape[-1] % 32 == 0 and not name.startswith("token_embd"):
            q = gguf.quants.quantize(t, QT.Q8_0)
            w.add_tensor(name, q, raw_dtype=QT.Q8_0)
            written[name] = gguf.quants.dequantize(q, QT.Q8_0).reshape(t.shape).astype(np.float32)
        else:
            w.add_tensor(name, t)
            written[name] = t
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


def load(path):
    return forward.Transformer(forward.GGUFModel(path))


def tmp(name):
    return os.path.join(TMP, name)


def rand_tokens(n, vocab=258):
    return [int(t) for t in RNG.integers(0, vocab, n)]


def assert_close(a, b, tol, what):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    assert a.shape == b.shape, f"{what}: shapes {a.shape} vs {b.shape}"
    err = np.max(np.abs(a - b)) / max(1e-12, np.max(np.abs(b)))
    assert err <= tol, f"{what}: max relative error {err:.3g} > {tol}"


# --------------------------------------------------------------------------------------------
# Plain-numpy single-token models written independently of forward.py
# --------------------------------------------------------------------------------------------


def _rms(x, w, eps=1e-6):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def one_token_logits(W, arch, token, n_layer, n_head, n_head_kv, head_dim, n_embd, expert_used=0):
    """Logits of a lone token at position 0. RoPE is the identity there and attention over one
    key returns that key's value, so each query head just reads V of its KV group."""
    x = W["token_embd.weight"][token].astype(np.float64)
    if arch == "gemma3":
        x = x * math.sqrt(n_embd)
    group = n_head // n_head_kv
    for il in range(n_layer):
        p = f"blk.{il}."
        h = _rms(x, W[p + "attn_norm.weight"])
        v = (W[p + "attn_v.weight"] @ h).reshape(n_head_kv, head_dim)
        heads = np.concatenate([v[hd // group] for hd in range(n_head)])
        o = W[p + "attn_output.weight"] @ heads
        if arch == "gemma3":
            o = _rms(o, W[p + "post_attention_norm.weight"])
        x = x + o
        h = _rms(x, W[p + "ffn_norm.weight"])
        if p + "ffn_gate_inp.weight" in W:
            r = W[p + "ffn_gate_inp.weight"] @ h
            pr = np.exp(r - r.max())
            pr /= pr.sum()
            top = sorted(range(len(pr)), key=lambda e: -pr[e])[:expert_used]
            tw = pr[top] / pr[top].sum()
            f = np.zeros_like(x)
            for e, we in zip(top, tw):
                g = W[p + "ffn_gate_exps.weight"][e] @ h
                u = W[p + "ffn_up_exps.weight"][e] @ h
                f += we * (W[p + "ffn_down_exps.weight"][e] @ (g / (1 + np.exp(-g)) * u))
        else:
            g = W[p + "ffn_gate.weight"] @ h
            u = W[p + "ffn_up.weight"] @ h
            if arch == "gemma3":
                act = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
            else:
                act = g / (1 + np.exp(-g))
            f = W[p + "ffn_down.weight"] @ (act * u)
        if arch == "gemma3":
            f = _rms(f, W[p + "post_ffw_norm.weight"])
        x = x + f
    x = _rms(x, W["output_norm.weight"])
    head = W.get("output.weight", W["token_embd.weight"])
    return head @ x


# --------------------------------------------------------------------------------------------
# Tests: forward
# --------------------------------------------------------------------------------------------

ARCH_CASES = {
    "llama": dict(arch="llama"),
    "qwen3": dict(arch="qwen3"),
    "qwen3moe": dict(arch="qwen3moe", n_expert=4, n_expert_used=2),
    "gemma3": dict(arch="gemma3", sliding_window=3, swa_pattern=2, tied=True, n_layer=4),
}


def _case_file(name, quant=False):
    path = tmp(f"{name}{'-q8' if quant else ''}.gguf")
    if not os.path.exists(path):
        write_model(path, quant_q8=quant, **ARCH_CASES[name])
    return path


def test_ggufread_matches_gguf_reader():
    for name in ARCH_CASES:
        for quant in (False, True):
            path = _case_file(name, quant)
            mine = GGUFFile(path)
            theirs = gguf.GGUFReader(path)
            for key, field in theirs.fields.items():
                if key.startswith("GGUF."):
                    continue
                a, b = mine.fields[key], field.contents()
                if isinstance(b, float):
                    assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), key
                else:
                    assert a == b, f"{key}: {a!r} != {b!r}"
            assert set(mine.tensors) == {t.name for t in theirs.tensors}
            for t in theirs.tensors:
                m = mine.tensors[t.name]
                assert m.qtype == t.tensor_type, t.name
                assert list(m.ne) == t.shape.tolist(), t.name
                assert np.array_equal(m.data.reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1)), t.name


def test_one_token_matches_plain_numpy():
    for name, case in ARCH_CASES.items():
        for quant in (False, True):
            path = _case_file(name, quant)
            model = load(path)
            W = {k: model.m.weight(k) for k in model.m.tensors}
            c = model.cfg
            for tok in (0, 7, 257):
                want = one_token_logits(W, case["arch"], tok, c.n_layer, c.n_head, c.n_head_kv, c.head_dim,
                                        c.n_embd, expert_used=case.get("n_expert_used", 0))
                got = model.logits([tok])[0]
                assert_close(got, want, 2e-5, f"{name} q8={quant} token {tok}")


def test_q8_weights_are_what_was_written():
    path = tmp("llama-q8-check.gguf")
    written = write_model(path, "llama", quant_q8=True)
    model = load(path)
    for name, w in written.items():
        assert np.array_equal(model.m.weight(name), w), name


def test_causality():
    for name in ARCH_CASES:
        model = load(_case_file(name))
        toks = rand_tokens(9)
        a = model.logits(toks)
        b = model.logits(toks[:5] + rand_tokens(4))
        assert_close(a[:5], b[:5], 1e-6, f"{name}: prefix logits changed with later tokens")
        assert np.max(np.abs(a[5:] - b[5:])) > 1e-4, f"{name}: later logits ignore the changed tokens"


def test_incremental_equals_full_recompute():
    # Gemma's case has window 3 and 8 tokens, so local layers drop keys in both paths.
    for name in ARCH_CASES:
        model = load(_case_file(name, quant=True))
        toks = rand_tokens(8)
        full = model.logits(toks)
        model.reset()
        steps = [model.step(toks[:3], "all")]
        for t in toks[3:]:
            steps.append(model.step([t], "all"))
        assert_close(np.concatenate(steps), full, 2e-5, f"{name}: incremental vs full")


def test_sliding_window_limits_context():
    # One local layer with window 3: position i attends to positions i-2..i, so changing token 0
    # moves positions 0..2 and leaves positions >= 3 exactly alone; a global layer sees it.
    model = load(_case_file("gemma3"))
    assert model.cfg.swa_layers == [True, False, True, False]
    model.cfg.n_layer = 1
    toks = rand_tokens(8)
    toks2 = [(toks[0] + 1) % 258] + toks[1:]
    model.cfg.swa_layers = [True]
    a, b = model.logits(toks), model.logits(toks2)
    assert np.max(np.abs(a[1:3] - b[1:3])) > 1e-4, "window 3: positions 1..2 must see position 0"
    assert_close(a[3:], b[3:], 1e-6, "window 3: positions >= 3 must not see position 0")
    model.cfg.swa_layers = [False]
    a, b = model.logits(toks), model.logits(toks2)
    assert np.max(np.abs(a[3:] - b[3:])) > 1e-4, "a global layer must see position 0"


def test_gemma_layer_pattern_default():
    path = tmp("gemma-pattern.gguf")
    write_model(path, "gemma3", n_layer=12, sliding_window=4)
    c = load(path).cfg
    assert c.swa_layers == [i % 6 != 5 for i in range(12)], c.swa_layers
    assert c.rope_base_swa == 10000.0 and c.rope_base == 1000000.0
    assert abs(c.embd_scale - math.sqrt(32)) < 1e-12 and abs(c.attn_scale - 1 / math.sqrt(8)) < 1e-12
    for period, want in ((1, [False] * 4), (0, [True] * 4), (3, [True, True, False, True])):
        path = tmp(f"gemma-pattern-{period}.gguf")
        write_model(path, "gemma3", n_layer=4, sliding_window=4, swa_pattern=period)
        assert load(path).cfg.swa_layers == want, (period, load(path).cfg.swa_layers)


def test_zero_blocks_give_normed_embedding_logits():
    n_layer, n_embd = 2, 32
    over = {}
    for il in range(n_layer):
        over[f"blk.{il}.attn_output.weight"] = np.zeros((n_embd, 32), np.float32)
        over[f"blk.{il}.ffn_down.weight"] = np.zeros((n_embd, 48), np.float32)
    path = tmp("llama-zero.gguf")
    W = write_model(path, "llama", overrides=over)
    toks = rand_tokens(6)
    got = load(path).logits(toks)
    want = _rms(W["token_embd.weight"][toks], W["output_norm.weight"]) @ W["output.weight"].T
    assert_close(got, want, 1e-5, "zeroed blocks")


def test_moe_with_identical_experts_equals_dense():
    # qwen3moe where every expert is the same FFN must equal qwen3 with that FFN, for top-1 of 1
    # and top-2 of 3 (the renormalized top-k weights sum to 1).
    dense_path = tmp("qwen3-dense.gguf")
    W = write_model(dense_path, "qwen3")
    toks = rand_tokens(6)
    dense = load(dense_path).logits(toks)
    shared = {k: v for k, v in W.items()
              if not any(s in k for s in ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"))}
    for n_expert, used in ((1, 1), (3, 2)):
        over = dict(shared)
        for il in range(2):
            p = f"blk.{il}."
            for part in ("gate", "up", "down"):
                over[p + f"ffn_{part}_exps.weight"] = np.stack([W[p + f"ffn_{part}.weight"]] * n_expert)
        moe_path = tmp(f"qwen3moe-same-{n_expert}.gguf")
        write_model(moe_path, "qwen3moe", n_expert=n_expert, n_expert_used=used, overrides=over)
        assert_close(load(moe_path).logits(toks), dense, 1e-5, f"{n_expert} identical experts top-{used}")


def test_moe_routing_uses_renormalized_top_k():
    # Experts that differ; check one token by hand (softmax over all, top-k, renormalize).
    path = _case_file("qwen3moe")
    model = load(path)
    W = {k: model.m.weight(k) for k in model.m.tensors}
    h = RNG.standard_normal((1, 32)).astype(np.float32)
    got = model.moe_ffn(0, h)[0]
    p = "blk.0."
    r = W[p + "ffn_gate_inp.weight"] @ h[0].astype(np.float64)
    pr = np.exp(r - r.max()) / np.exp(r - r.max()).sum()
    top = np.argsort(-pr)[:2]
    want = np.zeros(32)
    for e in top:
        g = W[p + "ffn_gate_exps.weight"][e] @ h[0]
        u = W[p + "ffn_up_exps.weight"][e] @ h[0]
        want += pr[e] / pr[top].sum() * (W[p + "ffn_down_exps.weight"][e] @ (g / (1 + np.exp(-g)) * u))
    assert_close(got, want, 1e-5, "MoE top-2 mixture")


def test_rope_properties():
    cfg = forward.load_config(forward.GGUFModel(_case_file("qwen3")))
    q = RNG.standard_normal((1, 1, 8)).astype(np.float32)
    k = RNG.standard_normal((1, 1, 8)).astype(np.float32)
    for neox in (True, False):
        cfg.rope_neox = neox

        def rot(x, p):
            return forward.rope(x, np.array([p]), cfg, 10000.0, 1.0, None)[0, 0].astype(np.float64)

        assert np.allclose(rot(q, 0), q[0, 0], atol=1e-7), "position 0 must be the identity"
        assert abs(np.linalg.norm(rot(q, 5)) - np.linalg.norm(q)) < 1e-5, "rotation keeps the norm"
        d1 = rot(q, 7) @ rot(k, 3)
        d2 = rot(q, 19) @ rot(k, 15)
        assert abs(d1 - d2) < 1e-4, "scores depend only on relative position"
        # Pair 0 turns by exactly `pos` radians (base^0 = 1).
        x = np.zeros((1, 1, 8), np.float32)
        x[0, 0, 0] = 1.0
        r = rot(x, 2)
        partner = 4 if neox else 1
        assert abs(r[0] - math.cos(2)) < 1e-6 and abs(r[partner] - math.sin(2)) < 1e-6


def _permute_like_llama_converter(w, n_head):
    # HF Llama Q/K rows are in "rotate_half" order; llama.cpp's converter reorders each head's
    # rows from [first half | second half] to interleaved pairs.
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def test_llama_normal_rope_on_permuted_weights_equals_neox():
    # A llama GGUF holds permuted Q/K so that adjacent-pair rope reproduces HF's half-split rope.
    base_path = tmp("llama-hf-order.gguf")
    W = write_model(base_path, "llama")
    over = {}
    for il in range(2):
        p = f"blk.{il}."
        over[p + "attn_q.weight"] = _permute_like_llama_converter(W[p + "attn_q.weight"], 4)
        over[p + "attn_k.weight"] = _permute_like_llama_converter(W[p + "attn_k.weight"], 2)
    perm_path = tmp("llama-permuted.gguf")
    write_model(perm_path, "llama", overrides={**W, **over})
    toks = rand_tokens(7)
    hf_style = load(base_path)
    hf_style.cfg.rope_neox = True
    want = hf_style.logits(toks)
    got = load(perm_path).logits(toks)
    assert load(perm_path).cfg.rope_neox is False
    assert_close(got, want, 1e-5, "permuted llama with normal rope vs neox")
    assert np.max(np.abs(load(base_path).logits(toks) - want)) > 1e-3, "layouts must differ"


def test_rope_freq_factors_and_linear_scaling_agree():
    # Llama 3's rope_freqs tensor divides each pair's frequency; a uniform factor f must equal
    # linear scaling by f (positions divided by f), and differ from no scaling.
    base = tmp("llama-rope-base.gguf")
    W = write_model(base, "llama")
    toks = rand_tokens(7)
    factors = tmp("llama-rope-factors.gguf")
    write_model(factors, "llama", overrides={**W, "rope_freqs.weight": np.full(4, 2.0, np.float32)})
    linear = tmp("llama-rope-linear.gguf")
    write_model(linear, "llama", overrides=W,
                extra_meta={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0})
    a, b, c = load(factors).logits(toks), load(linear).logits(toks), load(base).logits(toks)
    assert_close(a, b, 1e-5, "uniform rope_freqs vs linear scaling")
    assert np.max(np.abs(a - c)) > 1e-3, "scaling must change the logits"


def test_greedy_matches_argmax_and_stops_at_eos():
    path = _case_file("qwen3")
    model = load(path)
    prompt = rand_tokens(4)
    out = model.greedy(prompt, 6)
    assert len(out) == 6
    seq = list(prompt)
    for t in out:
        assert t == int(np.argmax(model.logits(seq)[-1]))
        seq.append(t)
    # Same weights, with EOS set to the third generated token: generation stops right after it.
    W = {k: model.m.weight(k) for k in model.m.tensors}
    eos_path = tmp("qwen3-eos.gguf")
    write_model(eos_path, "qwen3", overrides=W, eos=out[2])
    got = load(eos_path).greedy(prompt, 6)
    first = out.index(out[2])
    assert got == out[:first + 1], (got, out)


def test_cli_contract():
    path = _case_file("gemma3", quant=True)
    npy = tmp("cli.npy")
    script = os.path.join(_HERE, "forward.py")
    subprocess.run([sys.executable, script, "--model", path, "--tokens", "1,2,3", "--out", npy], check=True)
    arr = np.load(npy)
    assert arr.dtype == np.float32 and arr.shape == (3, 258)
    assert_close(arr, load(path).logits([1, 2, 3]), 1e-6, "cli logits")
    r = subprocess.run([sys.executable, script, "--model", path, "--tokens", "1,2,3", "--greedy", "4"],
                       check=True, capture_output=True, text=True)
    assert json.loads(r.stdout) == {"tokens": load(path).greedy([1, 2, 3], 4)}
    r = subprocess.run([sys.executable, script, "--model", path, "--tokens", "1,2,3", "--greedy", "4", "--margins"],
                       check=True, capture_output=True, text=True)
    got = json.loads(r.stdout)
    assert got["tokens"] == load(path).greedy([1, 2, 3], 4) and len(got["margins"]) == 4
    seq = [1, 2, 3]
    for t, margin in zip(got["tokens"], got["margins"]):
        row = np.sort(load(path).logits(seq)[-1])
        assert abs((row[-1] - row[-2]) - margin) < 1e-4 and margin >= 0
        seq.append(t)
    r = subprocess.run([sys.executable, script, "--model", path, "--tokens", "1,999", "--out", npy],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "outside the vocabulary" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, script, "--model", tmp("nope.gguf"), "--tokens", "1", "--out", npy],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "does not exist" in r.stderr, r.stderr


# --------------------------------------------------------------------------------------------
# Tests: tokenizers on hand-made vocabularies
# --------------------------------------------------------------------------------------------


def write_vocab_only(path, model, tokens, types, scores=None, merges=None, pre=None, bos=None, eos=None, unk=None,
                     space_prefix=False):
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model(model)
    if pre:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if unk is not None:
        w.add_unk_token_id(unk)
    if space_prefix is not None:
        w.add_bool("tokenizer.ggml.add_space_prefix", space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_byte_level_bpe_by_hand():
    tokens, types = byte_vocab()
    merges = ["h e", "l l", "ll o", "he llo", "Ġ t", "Ġt he", "w o"]
    extra = ["he", "ll", "llo", "hello", "Ġt", "Ġthe", "wo"]
    tokens = tokens + extra
    types = types + [1] * len(extra)
    path = tmp("bpe-vocab.gguf")
    write_vocab_only(path, "gpt2", tokens, types, merges=merges, pre="gpt2", bos=256, eos=257)
    tok = reftok.load_tokenizer(path)
    idx = {t: i for i, t in enumerate(tokens)}
    want = [idx[s] for s in ["hello", "Ġthe", "Ġ", "wo", "r", "l", "d"]]
    assert tok.encode("hello the world") == want, tok.encode("hello the world")
    # Specials written in the text map to their ids; multi-byte UTF-8 becomes byte symbols.
    got = tok.encode("<|bos|>é")
    assert got == [256, idx[reftok.bytes_to_unicode()[0xC3]], idx[reftok.bytes_to_unicode()[0xA9]]], got
    for text in ["hello the world", "naïve café 日本 🦀\n\n  x", "<|bos|>hi<|eos|>"]:
        assert tok.decode(tok.encode(text)) == text


def test_pretokenizer_regexes():
    import regex
    llama3 = regex.compile(reftok.PRE_TOKENIZERS["llama-bpe"])
    qwen2 = regex.compile(reftok.PRE_TOKENIZERS["qwen2"])
    gpt2 = regex.compile(reftok.PRE_TOKENIZERS["gpt2"])
    s = "I'M 12345 ok!!\n\n  done"
    assert llama3.findall(s) == ["I", "'M", " ", "123", "45", " ok", "!!\n\n", " ", " done"]
    assert qwen2.findall(s) == ["I", "'M", " ", "1", "2", "3", "4", "5", " ok", "!!\n\n", " ", " done"]
    assert gpt2.findall(s) == ["I", "'", "M", " 12345", " ok", "!!", "\n\n ", " done"]


_CORPUS_WORDS = ("the quick brown fox jumps over the lazy dog I'm you're we'll they've it's don't "
                 "hello world 2024 12345 3.14 naïve café façade 日本語 東京 🦀🚀 <html> x+=1; f(x) == y\n"
                 "\tindent    spaces\n\n\nnewlines CAPS MiXeD 'quoted' \"double\" — – … ¿qué? ÜBER").split(" ")


def _random_text(rng, n_words):
    seps = [" ", "  ", "\n", " \n", "\t", "", "\n\n", "   "]
    return "".join(str(rng.choice(_CORPUS_WORDS)) + str(rng.choice(seps)) for _ in range(n_words))


def test_byte_level_bpe_matches_hf_tokenizers():
    # Differential check: train a small byte-level BPE with Hugging Face `tokenizers` for each
    # pre-tokenizer pattern, store its vocabulary and merges in a GGUF, and compare encodings.
    try:
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    except ImportError:
        raise Skip("the `tokenizers` package is not installed (tests/reference/requirements.txt)")
    rng = np.random.default_rng(7)
    corpus = [_random_text(rng, 30) for _ in range(300)]
    for pre in ("gpt2", "llama-bpe", "qwen2"):
        ignore = pre in reftok.IGNORE_MERGES
        hf = Tokenizer(models.BPE(ignore_merges=ignore))
        hf.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(reftok.PRE_TOKENIZERS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|eos|>"], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        hf.train_from_iterator(corpus, trainer)
        model = json.loads(hf.to_str())["model"]
        vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
        assert [i for _, i in vocab] == list(range(len(vocab)))
        tokens = [t for t, _ in vocab]
        types = [3 if t == "<|eos|>" else 1 for t in tokens]
        merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
        path = tmp(f"hf-bpe-{pre}.gguf")
        write_vocab_only(path, "gpt2", tokens, types, merges=merges, pre=pre, eos=tokens.index("<|eos|>"),
                         space_prefix=None)
        tok = reftok.load_tokenizer(path)
        texts = [_random_text(rng, 12) for _ in range(150)] + ["<|eos|>hello<|eos|> world", "", " ", "\n\n "]
        for text in texts:
            want = hf.encode(text).ids
            got = tok.encode(text)
            assert got == want, f"pre={pre} text={text!r}: {got} != {want}"
            assert tok.decode(got) == text


def spm_vocab():
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [3, 3, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    normal = [("▁", -20), ("h", -21), ("e", -22), ("l", -23), ("o", -24), ("w", -25), ("r", -26),
              ("d", -27), ("he", -1), ("ll", -2), ("llo", -3), ("hello", -4), ("▁w", -5), ("or", -6),
              ("▁wor", -7), ("ld", -8), ("▁world", -9), ("▁hello", -10)]
    for p, s in normal:
        tokens.append(p)
        types.append(1)
        scores.append(float(s))
    for p in ["<start_of_turn>", "\n", "  "]:
        tokens.append(p)
        types.append(3 if p.startswith("<") else 4)
        scores.append(0.0)
    return tokens, types, scores


def test_sentencepiece_by_hand():
    tokens, types, scores = spm_vocab()
    path = tmp("spm-vocab.gguf")
    write_vocab_only(path, "llama", tokens, types, scores=scores, bos=2, eos=1, unk=3)
    tok = reftok.load_tokenizer(path)
    idx = {t: i for i, t in enumerate(tokens)}
    assert tok.encode("hello world") == [idx["hello"], idx["▁world"]]
    assert tok.encode(" hello") == [idx["▁hello"]], "no dummy prefix; a real space becomes ▁"
    # 'é' is not a piece: byte fallback to its UTF-8 bytes.
    assert tok.encode("hé") == [idx["h"], idx["<0xC3>"], idx["<0xA9>"]]
    # Control and user-defined tokens in the text, including a literal two-space token.
    got = tok.encode("<start_of_turn>hello\nworld  hello")
    want = [idx["<start_of_turn>"], idx["hello"], idx["\n"], idx["w"], idx["or"], idx["ld"], idx["  "], idx["hello"]]
    assert got == want, (got, want)
    for text in ["hello world", " hello", "hé", "<start_of_turn>hello\nworld  hello"]:
        assert tok.decode(tok.encode(text)) == text
    # Without the add_space_prefix key, SentencePiece's dummy prefix is on.
    path = tmp("spm-vocab-prefix.gguf")
    write_vocab_only(path, "llama", tokens, types, scores=scores, bos=2, eos=1, unk=3, space_prefix=None)
    tok = reftok.load_tokenizer(path)
    assert tok.encode("hello") == [idx["▁hello"]]
    assert tok.decode([idx["▁hello"]]) == "hello"


# --------------------------------------------------------------------------------------------
# Tests: the real Gemma 3 270M file (skipped when absent)
# --------------------------------------------------------------------------------------------


def models_dir():
    root = os.path.abspath(os.path.join(_HERE, "..", ".."))
    return os.environ.get("HIPDECODE_MODELS_DIR") or os.path.join(root, "models")


def gemma_path():
    p = os.path.join(models_dir(), "gemma3-270m-q4_k_m.gguf")
    return p if os.path.exists(p) else None


class Skip(Exception):
    pass


class MissingModel(Skip):
    """A skip because a model file is absent: a failure when HIPDECODE_REQUIRE_MODELS=1."""


REQUIRE_MODELS_VAR = "HIPDECODE_REQUIRE_MODELS"


def require_models(environ=os.environ):
    """HIPDECODE_REQUIRE_MODELS as a switch: unset, empty or 0 allow skipping, 1 requires models."""
    value = environ.get(REQUIRE_MODELS_VAR, "").strip()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise ValueError(f"{REQUIRE_MODELS_VAR}={value!r} is not understood; use 1 (required) or 0 / empty / unset")


def test_synth_models_from_xtask():
    # Files from `cargo xtask synth-model <preset>` (default path <models dir>/synth-<preset>.gguf):
    # the reference must load them, and its one-pass and incremental paths must agree.
    found = 0
    for preset in ("tiny-llama", "tiny-qwen3", "tiny-qwen3moe", "tiny-gemma3", "tiny-qwen2", "tiny-gemma2", "tiny-phi3", "tiny-phi3-longrope",
                   "tiny-mistral-nemo"):
        path = os.path.join(models_dir(), f"synth-{preset}.gguf")
        if not os.path.exists(path):
            continue
        found += 1
        model = load(path)
        toks = rand_tokens(12, model.cfg.vocab)
        full = model.logits(toks)
        model.reset()
        inc = np.concatenate([model.step(toks[:4], "all")] + [model.step([t], "all") for t in toks[4:]])
        assert_close(inc, full, 2e-5, f"{preset}: incremental vs full")
        tok = reftok.load_tokenizer(path)
        text = "Hello world, the capital of France is Paris.\n"
        assert tok.decode(tok.encode(text)) == text, preset
    if not found:
        raise MissingModel(f"no synth-*.gguf in {models_dir()} (cargo xtask synth-model tiny-llama ...)")


def test_real_gemma_tokenizer():
    path = gemma_path()
    if path is None:
        raise MissingModel("Gemma 3 270M not found (cargo xtask fetch-model gemma3-270m)")
    tok = reftok.load_tokenizer(path)
    # Known ids of the public Gemma 3 tokenizer (published prompts of other projects).
    assert tok.encode("The capital of France is") == [818, 5279, 529, 7001, 563]
    assert tok.encode("Hello") == [9259]
    assert tok.encode("<start_of_turn>user\nwhy is the sky blue<end_of_turn>\n<start_of_turn>model") == [
        105, 2364, 107, 36425, 563, 506, 7217, 3730, 106, 107, 105, 4368]
    assert tok.vocab.tokens[tok.vocab.bos] == "<bos>"
    for text in ["The capital of France is", "  two spaces\tand\ttabs\n\n\nnewlines",
                 "naïve café 日本語 🦀 12345", "<start_of_turn>model\nHi!<end_of_turn>"]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text, (text, ids)
    # Digits are single tokens; the vocabulary has no multi-digit ASCII pieces.
    assert len(tok.encode("12345")) == 5


def test_real_gemma_continues_sensibly():
    path = gemma_path()
    if path is None:
        raise MissingModel("Gemma 3 270M not found (cargo xtask fetch-model gemma3-270m)")
    tok = reftok.load_tokenizer(path)
    model = load(path)
    # Natural English should be well predicted: mean NLL well under 4 nats (a random model
    # over 262k tokens gives ~12.5).
    text = ("Paris is the capital and most populous city of France, with an estimated population of "
            "over two million residents.")
    ids = [2] + tok.encode(text)
    lg = model.logits(ids).astype(np.float64)
    lg -= lg.max(-1, keepdims=True)
    lp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
    nll = -np.mean([lp[i, ids[i + 1]] for i in range(len(ids) - 1)])
    print(f"    gemma mean NLL on a reference sentence: {nll:.3f} nats/token")
    assert nll < 4.0, nll
    out = tok.decode(model.greedy([2] + tok.encode("Once upon a time"), 8))
    print(f"    'Once upon a time' -> {out!r}")
    assert "there" in out or "was" in out, out


def test_missing_models_fail_only_when_required():
    # The runner's decision, checked on both switch values and a malformed one.
    assert outcome_of_skip(MissingModel("absent"), required=True) == "FAIL"
    assert outcome_of_skip(MissingModel("absent"), required=False) == "SKIP"
    assert outcome_of_skip(Skip("no tokenizers package"), required=True) == "SKIP"
    assert require_models({}) is False and require_models({REQUIRE_MODELS_VAR: "0"}) is False
    assert require_models({REQUIRE_MODELS_VAR: "1"}) is True
    try:
        require_models({REQUIRE_MODELS_VAR: "yes"})
    except ValueError as e:
        assert "use 1" in str(e), e
    else:
        raise AssertionError("HIPDECODE_REQUIRE_MODELS=yes was accepted")


def outcome_of_skip(skip, required):
    """A missing model under HIPDECODE_REQUIRE_MODELS=1 fails; every other skip stays a skip."""
    return "FAIL" if required and isinstance(skip, MissingModel) else "SKIP"


def main() -> int:
    try:
        required = require_models()
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    sel = sys.argv[sys.argv.index("-k") + 1] if "-k" in sys.argv else ""
    tests = [(n, f) for n, f in globals().items() if n.startswith("test_") and callable(f) and sel in n]
    passed = failed = skipped = 0
    for name, fn in tests:
        try:
            fn()
            passed += 1
            print(f"PASS {name}")
        except Skip as s:
            if outcome_of_skip(s, required) == "FAIL":
                failed += 1
                print(f"FAIL {name}: {REQUIRE_MODELS_VAR}=1 but {s}")
            else:
                skipped += 1
                print(f"SKIP {name}: {s}")
        except Exception:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed or not tests else 0


if __name__ == "__main__":
    sys.exit(main())
