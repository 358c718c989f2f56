#!/usr/bin/env python3
"""Independent reference for gguf-loader's dequantization.

Prints one line per tensor of a GGUF file: name, ggml type, element count, and the sha256 of the
tensor dequantized to float32 by gguf-py (`gguf.quants.dequantize`), as little-endian bytes in
GGML element order. The Rust test computes the same digest from its own dequantizer.

Usage: gguf_dequant_hashes.py MODEL.gguf [NAME ...]
"""
import hashlib
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    reader = GGUFReader(sys.argv[1])
    wanted = set(sys.argv[2:])
    for tensor in reader.tensors:
        if wanted and tensor.name not in wanted:
            continue
        values = dequantize(tensor.data, tensor.tensor_type)
        data = np.ascontiguousarray(values, dtype="<f4").tobytes()
        digest = hashlib.sha256(data).hexdigest()
        print(f"{tensor.name}\t{tensor.tensor_type.name}\t{tensor.n_elements}\t{digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
