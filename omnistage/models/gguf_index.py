"""The tensor table of a GGUF file, read fast: names, shapes, types and where the bytes are.

`gguf.GGUFReader` parses every metadata value into Python objects (a model's
tokenizer is ~100k strings: 2.5 s for SmolLM2's file); loading weights needs
only the tensor table, so this reads the header with the metadata skipped
(`general.architecture` and `general.alignment` kept) and maps the file.
Layout (GGUF v2/v3, little-endian): magic, version, tensor count, key-value
count, the key-values, the tensor infos (name, dims, type, offset), padding to
the alignment, then the tensor data.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omnistage.layers.ggml_types import BLOCK_SIZES, GGMLType

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALARS |= {10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]
    """ggml order: shape[0] is the length of a row (columns), shape[1] the rows."""
    ggml_type: GGMLType
    data: np.ndarray
    """The tensor's bytes: uint8 [rows, row_bytes] for a 2-D tensor, read-only (mapped)."""


@dataclass(frozen=True)
class GGUFIndex:
    architecture: str | None
    tensors: list[GGUFTensor]


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str) -> int | float:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = int(self.unpack("<Q"))
        self.pos += n
        return bytes(self.buf[self.pos - n : self.pos]).decode("utf-8", errors="replace")

    def skip_value(self, vtype: int) -> None:
        if vtype in _SCALARS:
            self.pos += struct.calcsize(_SCALARS[vtype])
        elif vtype == _STRING:
            length = int(self.unpack("<Q"))  # (read before `pos` is: unpack moves it)
            self.pos += length
        elif vtype == _ARRAY:
            item, count = int(self.unpack("<I")), int(self.unpack("<Q"))
            if item in _SCALARS:
                self.pos += count * struct.calcsize(_SCALARS[item])
            elif item == _STRING:
                self._skip_strings(count)
            else:
                for _ in range(count):
                    self.skip_value(item)
        else:
            raise ValueError(f"unknown GGUF value type {vtype} at byte {self.pos}")

    def _skip_strings(self, count: int) -> None:
        """Skip `count` strings (a tokenizer's vocabulary: ~100k) in one tight loop."""
        length_at, buf, pos = _U64.unpack_from, self.buf, self.pos
        for _ in range(count):
            pos += 8 + length_at(buf, pos)[0]
        self.pos = pos


def read_gguf_index(path: Path) -> GGUFIndex:
    """The tensor table of `path`. ValueError naming the file when it is not a GGUF."""
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse(buf)
    except (struct.error, ValueError, KeyError) as e:
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from e


def _parse(buf: mmap.mmap) -> GGUFIndex:
    if buf[:4] != b"GGUF":
        raise ValueError("no GGUF magic")
    c = _Cursor(buf)
    c.pos = 4
    version = int(c.unpack("<I"))
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported")
    n_tensors, n_kv = int(c.unpack("<Q")), int(c.unpack("<Q"))
    architecture, alignment = None, 32
    for _ in range(n_kv):
        key, vtype = c.string(), int(c.unpack("<I"))
        if key == "general.architecture" and vtype == _STRING:
            architecture = c.string()
        elif key == "general.alignment" and vtype in _SCALARS:
            alignment = int(c.unpack(_SCALARS[vtype]))
        else:
            c.skip_value(vtype)
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        dims = tuple(int(c.unpack("<Q")) for _ in range(int(c.unpack("<I"))))
        infos.append((name, dims, GGMLType(int(c.unpack("<I"))), int(c.unpack("<Q"))))
    start = -(-c.pos // alignment) * alignment
    tensors = []
    for name, dims, ggml_type, offset in infos:
        block_elems, block_bytes = BLOCK_SIZES[ggml_type]
        rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
        row_bytes = dims[0] // block_elems * block_bytes
        data = np.frombuffer(buf, np.uint8, rows * row_bytes, start + offset)
        tensors.append(GGUFTensor(name, dims, ggml_type, data.reshape(rows, row_bytes)))
    return GGUFIndex(architecture, tensors)
