"""`TensorBlob`: a tensor as a msgspec struct (dtype name, shape, raw bytes) — no pickle.

Used wherever a tensor crosses a process boundary inside a message (runner
outputs with hidden states, prompt embeddings of a new request). Bulk payloads
between stages use `omnistage.pipeline.payload` instead, which shares the dtype
table below.
"""

from __future__ import annotations

import msgspec
import numpy as np
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
_NUMPY_DTYPES = {
    dt: torch.empty(0, dtype=dt).numpy().dtype for dt in DTYPES.values() if dt != torch.bfloat16
}


class TensorBlob(msgspec.Struct, array_like=True, frozen=True):
    dtype: str
    shape: list[int]
    data: bytes


def tensor_bytes(t: torch.Tensor) -> bytes:
    """Raw bytes of a tensor (contiguous CPU copy first when needed)."""
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def tensor_from_bytes(
    dtype: str, shape: list[int] | tuple[int, ...], data: bytes | memoryview
) -> torch.Tensor:
    """A fresh (owned, writable) tensor from raw bytes."""
    try:
        torch_dtype = DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unsupported tensor dtype {dtype!r}") from None
    storage = torch.int16 if torch_dtype == torch.bfloat16 else torch_dtype  # numpy has no bf16
    t = torch.from_numpy(np.frombuffer(data, dtype=_NUMPY_DTYPES[storage]).copy())
    if torch_dtype == torch.bfloat16:
        t = t.view(torch.bfloat16)
    return t.reshape(list(shape))


def tensor_to_blob(t: torch.Tensor) -> TensorBlob:
    try:
        name = DTYPE_NAMES[t.dtype]
    except KeyError:
        raise ValueError(f"unsupported tensor dtype {t.dtype}") from None
    return TensorBlob(name, list(t.shape), tensor_bytes(t))


def blob_to_tensor(blob: TensorBlob) -> torch.Tensor:
    return tensor_from_bytes(blob.dtype, blob.shape, blob.data)
