"""The sampler's chain in numpy, written from each transform's documented formula, for the
comparison in crates/decode/tests/sampler_reference.rs:

- repeat penalty (llama.cpp's penalties sampler): over the last repeat_last_n tokens, a seen
  token's logit is divided by repeat_penalty when positive and multiplied by it otherwise;
- presence and frequency penalties (OpenAI's API reference): logit -= count * frequency_penalty
  + (count > 0) * presence_penalty;
- top-k, then softmax(logit / temperature), then top-p (the smallest most-likely-first prefix
  whose probability reaches p);
- min-p (llama.cpp's): keep the tokens whose probability at temperature 1 is at least
  min_p times the largest one's.

Reads JSON on stdin: {"cases": [{"logits", "recent", "config"}...]}, config with the decode
crate's SamplerConfig field names. Writes {"results": [{"penalized", "kept", "probs"}...]}:
the logits after the penalties, the kept token ids most likely first (ties by id), and their
probabilities after renormalising.
"""

import json
import sys

import numpy as np


def penalize(logits, recent, c):
    out = np.array(logits, dtype=np.float64)
    n = c["repeat_last_n"]
    window = recent[max(0, len(recent) - n):] if n > 0 else []
    if n == 0 or (c["repeat_penalty"] == 1.0 and c["presence_penalty"] == 0.0
                  and c["frequency_penalty"] == 0.0):
        return out
    ids, counts = np.unique(np.array(window, dtype=np.int64), return_counts=True)
    for t, count in zip(ids, counts):
        if t >= len(out):
            continue
        if out[t] > 0:
            out[t] /= c["repeat_penalty"]
        else:
            out[t] *= c["repeat_penalty"]
        out[t] -= count * c["frequency_penalty"] + (count > 0) * c["presence_penalty"]
    return out


def chain(logits, c):
    ids = np.arange(len(logits))
    # Most likely first, ties by id.
    order = np.lexsort((ids, -logits))
    if c["top_k"] > 0:
        order = order[: c["top_k"]]
    kept = logits[order]
    top = kept[0]
    p = np.exp((kept - top) / c["temperature"])
    p /= p.sum()
    cum = np.cumsum(p)
    reach = np.nonzero(cum >= c["top_p"])[0]
    keep = reach[0] + 1 if len(reach) else len(order)
    order, kept, p = order[:keep], kept[:keep], p[:keep]
    if c["min_p"] > 0:
        rel = np.exp(kept - top)
        m = max(1, int(np.sum(rel >= c["min_p"])))
        order, p = order[:m], p[:m]
    return order, p / p.sum()


def main():
    cases = json.load(sys.stdin)["cases"]
    results = []
    for case in cases:
        c = case["config"]
        penalized = penalize(case["logits"], case["recent"], c)
        kept, probs = chain(penalized, c)
        results.append({
            "penalized": penalized.tolist(),
            "kept": kept.tolist(),
            "probs": probs.tolist(),
        })
    json.dump({"results": results}, sys.stdout)


main()
