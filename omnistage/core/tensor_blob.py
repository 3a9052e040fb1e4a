"""`TensorBlob`: a tensor as a msgspec struct (dtype name, shape, raw bytes) — no pickle.

Used wherever a tensor crosses a process boundary inside a message (runner
outputs with hidden states, prompt embeddings of a new request). Bulk payloads
between stages use `omnistage.core.payload` instead, which shares the dtype
table and the raw-byte helpers below.
"""

from __future__ import annotations

import math

import msgspec
import torch

DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


class TensorBlob(msgspec.Struct, array_like=True, frozen=True):
    dtype: str
    shape: list[int]
    data: bytes


def tensor_view_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of `t` as a flat uint8 view (a contiguous CPU copy first when needed)."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


def tensor_copy_from(
    src: bytes | memoryview, dtype: torch.dtype, shape: list[int] | tuple[int, ...]
) -> torch.Tensor:
    """A fresh (owned, writable) tensor holding a copy of the raw bytes in `src`."""
    flat = torch.empty(memoryview(src).nbytes, dtype=torch.uint8)
    if flat.numel():
        with memoryview(flat.numpy()) as dst:
            dst[:] = memoryview(src).cast("B")
    return flat.view(dtype).reshape(list(shape))


def tensor_to_blob(t: torch.Tensor) -> TensorBlob:
    try:
        name = DTYPE_NAMES[t.dtype]
    except KeyError:
        raise ValueError(f"unsupported tensor dtype {t.dtype}") from None
    return TensorBlob(name, list(t.shape), bytes(tensor_view_bytes(t)))


def blob_to_tensor(blob: TensorBlob) -> torch.Tensor:
    try:
        dtype = DTYPES[blob.dtype]
    except KeyError:
        raise ValueError(f"unsupported tensor dtype {blob.dtype!r}") from None
    expected = math.prod(blob.shape) * dtype.itemsize
    if len(blob.data) != expected:
        raise ValueError(
            f"tensor blob {blob.dtype}{blob.shape} needs {expected} bytes, got {len(blob.data)}"
        )
    return tensor_copy_from(blob.data, dtype, blob.shape)
