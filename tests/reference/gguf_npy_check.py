#!/usr/bin/env python3
"""Checks a .npy written by gguf-loader (`hipdecode inspect --tensor NAME --npy OUT`): numpy
loads it, and it equals gguf-py's dequantization of that tensor bit for bit, shape included.

Usage: gguf_npy_check.py MODEL.gguf TENSOR_NAME FILE.npy
"""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def main() -> int:
    model, name, npy = sys.argv[1:4]
    ours = np.load(npy)
    tensor = next(t for t in GGUFReader(model).tensors if t.name == name)
    reference = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    reference = reference.reshape([int(d) for d in reversed(tensor.shape)])
    if ours.dtype != np.float32 or ours.shape != reference.shape:
        print(f"{name}: got {ours.dtype} {ours.shape}, expected float32 {reference.shape}", file=sys.stderr)
        return 1
    if not np.array_equal(ours.view(np.uint32), reference.view(np.uint32)):
        print(f"{name}: values differ from gguf-py", file=sys.stderr)
        return 1
    print(f"ok {name} {ours.shape}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
