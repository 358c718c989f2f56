"""A small, fast GGUF (v2/v3) reader for the reference scripts.

gguf-py's GGUFReader builds a Python object per array element, which takes tens of seconds on a
262k-token vocabulary. This reader parses the same layout directly: metadata values become plain
Python values (numeric arrays become lists via numpy), tensors become uint8 views of a memory map
shaped the way `gguf.quants.dequantize` expects. test_reference.py checks that it agrees with
GGUFReader on every key and tensor of the test files.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

GGUF_MAGIC = b"GGUF"

# GGUF metadata value types.
_SCALARS = {
    0: ("<B", 1, np.uint8),
    1: ("<b", 1, np.int8),
    2: ("<H", 2, np.uint16),
    3: ("<h", 2, np.int16),
    4: ("<I", 4, np.uint32),
    5: ("<i", 4, np.int32),
    6: ("<f", 4, np.float32),
    7: ("<?", 1, np.bool_),
    10: ("<Q", 8, np.uint64),
    11: ("<q", 8, np.int64),
    12: ("<d", 8, np.float64),
}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(Exception):
    """The file is not a GGUF file this reader understands."""


@dataclass
class TensorInfo:
    name: str
    ne: tuple  # GGUF dims, fastest-varying first
    qtype: GGMLQuantizationType
    data: np.ndarray  # uint8, shape (ne[n-1], ..., ne[1], bytes per row)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.ne))


class GGUFFile:
    def __init__(self, path: str):
        self.path = path
        self._mm = np.memmap(path, dtype=np.uint8, mode="r")
        buf = memoryview(self._mm)
        self._buf = buf
        self._pos = 0
        if bytes(buf[0:4]) != GGUF_MAGIC:
            raise GGUFFormatError(f"{path} does not start with the GGUF magic")
        self._pos = 4
        version = self._u32()
        if version not in (2, 3):
            raise GGUFFormatError(f"{path} is GGUF version {version}; only 2 and 3 are supported")
        n_tensors = self._u64()
        n_kv = self._u64()
        self.fields: dict[str, object] = {}
        for _ in range(n_kv):
            key = self._str()
            self.fields[key] = self._value(self._u32())
        infos = []
        for _ in range(n_tensors):
            name = self._str()
            n_dims = self._u32()
            ne = tuple(self._u64() for _ in range(n_dims))
            qtype = GGMLQuantizationType(self._u32())
            offset = self._u64()
            infos.append((name, ne, qtype, offset))
        align = int(self.fields.get("general.alignment", 32))
        data_start = (self._pos + align - 1) // align * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, ne, qtype, offset in infos:
            block, type_size = GGML_QUANT_SIZES[qtype]
            if ne[0] % block:
                raise GGUFFormatError(f"tensor {name}: row length {ne[0]} is not a multiple of {block}")
            row_bytes = ne[0] // block * type_size
            n_rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
            start = data_start + offset
            end = start + n_rows * row_bytes
            if end > len(self._mm):
                raise GGUFFormatError(f"tensor {name} runs past the end of {path}")
            data = self._mm[start:end].reshape(tuple(reversed(ne[1:])) + (row_bytes,))
            self.tensors[name] = TensorInfo(name, ne, qtype, data)

    # -- primitive readers -------------------------------------------------------------------

    def _unpack(self, fmt: str, size: int):
        v = struct.unpack_from(fmt, self._buf, self._pos)[0]
        self._pos += size
        return v

    def _u32(self) -> int:
        return self._unpack("<I", 4)

    def _u64(self) -> int:
        return self._unpack("<Q", 8)

    def _str(self) -> str:
        n = self._u64()
        s = bytes(self._buf[self._pos:self._pos + n]).decode("utf-8", errors="surrogateescape")
        self._pos += n
        return s

    def _value(self, vtype: int):
        if vtype in _SCALARS:
            fmt, size, _ = _SCALARS[vtype]
            return self._unpack(fmt, size)
        if vtype == _STRING:
            return self._str()
        if vtype == _ARRAY:
            etype = self._u32()
            count = self._u64()
            if etype in _SCALARS:
                _, size, dt = _SCALARS[etype]
                arr = np.frombuffer(self._buf, dtype=np.dtype(dt).newbyteorder("<"), count=count,
                                    offset=self._pos)
                self._pos += size * count
                return arr.tolist()
            return [self._value(etype) for _ in range(count)]
        raise GGUFFormatError(f"unknown GGUF value type {vtype} at byte {self._pos}")
