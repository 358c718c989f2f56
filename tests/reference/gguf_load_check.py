#!/usr/bin/env python3
"""Checks that gguf-py reads a GGUF file: prints its architecture, counts and size, and
dequantizes the first and last tensor of every ggml type to check the values are finite.

Usage: gguf_load_check.py MODEL.gguf
"""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def main() -> int:
    reader = GGUFReader(sys.argv[1])
    arch = reader.fields["general.architecture"].contents()
    total = sum(int(t.n_bytes) for t in reader.tensors)
    by_type = {}
    for t in reader.tensors:
        by_type.setdefault(t.tensor_type.name, []).append(t)
    for name, tensors in sorted(by_type.items()):
        for t in {id(x): x for x in (tensors[0], tensors[-1])}.values():
            values = dequantize(t.data, t.tensor_type)
            if not np.isfinite(values).all():
                print(f"{t.name}: non-finite values", file=sys.stderr)
                return 1
    counts = ", ".join(f"{k}: {len(v)}" for k, v in sorted(by_type.items()))
    print(f"ok {arch}: {len(reader.fields)} fields, {len(reader.tensors)} tensors, "
          f"{total} tensor bytes ({counts})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
