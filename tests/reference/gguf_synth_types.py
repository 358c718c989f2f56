#!/usr/bin/env python3
"""Writes, with gguf-py, a GGUF holding one random tensor of every ggml type gguf-loader knows,
plus gguf-py's own f32 dequantization of each, for the Rust bit-exactness test.

Types gguf-py can quantize are quantized from random floats. For the K-quants (which gguf-py
cannot quantize) the blocks are random bytes whose fp16/f32 scale fields are overwritten with
finite values, so every code path of the dequantizer sees arbitrary quant bits.

Usage: gguf_synth_types.py OUT_DIR SEED
Writes OUT_DIR/types.gguf and OUT_DIR/<tensor name>.f32 (little-endian f32, GGML order) for each
type gguf-py can dequantize.
"""
import os
import sys

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, GGUFWriter
from gguf.quants import dequantize, quantize

QUANTIZABLE = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
# Byte offsets of the fp16 scale fields inside one block, per raw-byte type.
RAW_F16_SCALES = {
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_NL: [0],
    T.IQ4_XS: [0],
}
RAW_F32_SCALES = {T.Q8_K: [0]}
RAW_OTHER = [T.MXFP4]
ROWS, ROW_LEN = 3, 512


def random_blocks(rng, qtype):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_blocks = ROWS * ROW_LEN // block_size
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in RAW_F16_SCALES.get(qtype, []):
        scales = rng.uniform(-1.0, 1.0, size=n_blocks).astype(np.float16)
        blocks[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    for off in RAW_F32_SCALES.get(qtype, []):
        scales = rng.uniform(-1.0, 1.0, size=n_blocks).astype(np.float32)
        blocks[:, off:off + 4] = scales.view(np.uint8).reshape(n_blocks, 4)
    return blocks.reshape(ROWS, -1)


def main() -> int:
    out_dir, seed = sys.argv[1], int(sys.argv[2])
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(os.path.join(out_dir, "types.gguf"), "llama")
    writer.add_uint32("test.seed", seed)
    reference = {}
    for qtype in QUANTIZABLE:
        values = rng.standard_normal((ROWS, ROW_LEN)).astype(np.float32)
        if qtype == T.F32:
            data = values
        elif qtype == T.F16:
            data = values.astype(np.float16)
        else:
            data = quantize(values, qtype)
        name = f"t.{qtype.name}"
        writer.add_tensor(name, data, raw_dtype=qtype)
        reference[name] = (data, qtype)
    for qtype in list(RAW_F16_SCALES) + list(RAW_F32_SCALES) + RAW_OTHER:
        name = f"t.{qtype.name}"
        data = random_blocks(rng, qtype)
        writer.add_tensor(name, data, raw_dtype=qtype)
        reference[name] = (data, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for name, (data, qtype) in reference.items():
        try:
            values = dequantize(data, qtype)
        except NotImplementedError:
            continue
        path = os.path.join(out_dir, name + ".f32")
        np.ascontiguousarray(values, dtype="<f4").tofile(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
