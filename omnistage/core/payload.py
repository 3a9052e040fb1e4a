"""Payloads: the data one stage hands to the next, its schema and its wire format.

A payload is a flat dict of dotted keys to tensors or scalars
(``{"hidden_states.output": Tensor[positions, hidden], "meta.finished": True}``).
Every key must be declared in ``PAYLOAD_SCHEMA`` (``register_payload_key`` adds
more); ``validate_payload`` checks a payload against it, and both
``pack_payload`` (send) and ``unpack_payload`` (receive) call it, so a typo or a
wrongly shaped tensor is caught where it is made and named in the error.

Wire format (no pickle), one contiguous buffer::

    [ 8 bytes: header length H, little-endian ]
    [ H bytes: msgpack header, one entry per key:
        key, kind, scalar value | tensor dtype name, shape, offset, nbytes ]
    [ padding up to a multiple of 64 ]
    [ tensor bytes; each tensor starts at a 64-byte aligned offset
      (offsets are relative to the start of this data area) ]

``TensorBlob`` (with ``tensor_to_blob`` / ``blob_to_tensor``), the small single-tensor
form used inside other msgspec messages, is defined in ``omnistage.core.tensor_blob``
and re-exported here.
"""

from __future__ import annotations

import difflib
import mmap
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import torch

# One dtype table for every tensor that crosses a process (name on the wire -> dtype), and one
# TensorBlob: the single-tensor form used inside messages lives in core, re-exported here.
from omnistage.core.tensor_blob import (
    DTYPE_NAMES,
    DTYPES,
    TensorBlob,
    blob_to_tensor,
    tensor_copy_from,
    tensor_to_blob,
    tensor_view_bytes,
)

Payload = dict[str, torch.Tensor | int | float | bool | str]

_KINDS = ("tensor", "int", "float", "bool", "str")
_DTYPE_KINDS = ("float", "int", "any")
_KEY_RE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")
_SCALAR_TYPES: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}
_DTYPE_KIND_WORDS = {"float": "a floating-point dtype", "int": "an integer dtype (not bool)"}
_ALIGN = 64
_HEADER_LEN = struct.Struct("<Q")
_FORMAT_VERSION = 1


class PayloadError(ValueError):
    """A payload does not match the schema, or a buffer is not a valid packed payload."""


@dataclass(frozen=True)
class KeySpec:
    """What one payload key may hold."""

    kind: str
    """One of "tensor", "int", "float", "bool", "str" (bool is never accepted as int)."""
    dtype_kind: str = "any"
    """Tensors only: "float" (any floating dtype), "int" (integer dtypes, not bool) or "any"."""
    ndim: int | None = None
    """Tensors only: the required number of dimensions, or None for any."""
    doc: str = ""
    """What the key means and, for tensors, its shape."""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"KeySpec.kind must be one of {_KINDS}, got {self.kind!r}")
        if self.dtype_kind not in _DTYPE_KINDS:
            raise ValueError(
                f"KeySpec.dtype_kind must be one of {_DTYPE_KINDS}, got {self.dtype_kind!r}"
            )
        if self.ndim is not None and (type(self.ndim) is not int or self.ndim < 0):
            raise ValueError(f"KeySpec.ndim must be None or an int >= 0, got {self.ndim!r}")
        if self.kind != "tensor" and (self.dtype_kind != "any" or self.ndim is not None):
            raise ValueError("KeySpec.dtype_kind and KeySpec.ndim apply to tensor keys only")

    def describe(self) -> str:
        if self.kind != "tensor":
            return self.kind
        dims = "any-d" if self.ndim is None else f"{self.ndim}-d"
        return f"{dims} {self.dtype_kind}-dtype tensor"


def _t(dtype_kind: str, ndim: int | None, doc: str) -> KeySpec:
    return KeySpec("tensor", dtype_kind, ndim, doc)


PAYLOAD_SCHEMA: dict[str, KeySpec] = {
    "hidden_states.output": _t("float", 2, "[positions, hidden] hidden states of output tokens"),
    "hidden_states.prompt": _t("float", 2, "[positions, hidden] hidden states of prompt tokens"),
    "embed.prefill": _t("float", 2, "[positions, hidden] input embeddings for the prefill"),
    "embed.output": _t("float", 2, "[positions, hidden] embeddings of output tokens"),
    "ids.prompt": _t("int", 1, "[positions] prompt token ids"),
    "ids.output": _t("int", 1, "[positions] confirmed output token ids"),
    "codes.audio": _t("int", None, "audio codec tokens, e.g. [codebooks, frames]"),
    "codes.output": _t(
        "int", None, "[frames, 1 + codes] each output token, then the codes sampled with it"
    ),
    "codes.context": _t(
        "int", 2, "[frames, codes] frames a vocoder decodes as left context only (not output)"
    ),
    "audio.waveform": _t("float", 1, "[samples] mono waveform"),
    "mm.image_grid_thw": _t(
        "int", 2, "[images, 3] (t, h, w) patch grids of the prompt's images, in prompt order"
    ),
    "latents": _t("float", None, "diffusion latents, any layout"),
    "latents.output": _t("float", 2, "[frames, width] the float row sampled with each output"),
    "meta.finished": KeySpec("bool", doc="the producer's request has finished; last chunk"),
    "meta.chunk_index": KeySpec("int", doc="0-based index of this chunk on its edge"),
    "meta.request_id": KeySpec("str", doc="the request this payload belongs to"),
    "meta.source_stage": KeySpec("str", doc="name of the producing stage"),
    "meta.num_prompt_tokens": KeySpec("int", doc="prompt length at the producer"),
    "meta.text": KeySpec("str", doc="text produced so far"),
    "meta.start_position": KeySpec("int", doc="position of the first row of this chunk"),
}


def register_payload_key(name: str, spec: KeySpec) -> None:
    """Declare a new payload key; re-registering the same spec is a no-op."""
    if not isinstance(name, str) or not _KEY_RE.match(name):
        raise ValueError(f"payload key {name!r} must be dotted lowercase words, e.g. 'codes.audio'")
    if not isinstance(spec, KeySpec):
        raise TypeError(f"spec for payload key {name!r} must be a KeySpec, got {spec!r}")
    existing = PAYLOAD_SCHEMA.get(name)
    if existing is not None and existing != spec:
        raise ValueError(f"payload key {name!r} is already registered as {existing}")
    PAYLOAD_SCHEMA[name] = spec


def _type_name(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of dtype {value.dtype}"
    return type(value).__name__


def _check_value(key: str, spec: KeySpec, value: Any, where: str) -> None:
    if spec.kind != "tensor":
        # type() rather than isinstance(): bool is a subclass of int, and an int is no float.
        if type(value) is not _SCALAR_TYPES[spec.kind]:
            raise PayloadError(
                f"{where}: payload key {key!r} expects {spec.describe()}, got {_type_name(value)}"
            )
        return
    if not isinstance(value, torch.Tensor):
        raise PayloadError(
            f"{where}: payload key {key!r} expects {spec.describe()}, got {_type_name(value)}"
        )
    dtype = value.dtype
    if dtype not in DTYPE_NAMES:
        raise PayloadError(
            f"{where}: payload key {key!r} has unsupported dtype {dtype}; "
            f"supported: {', '.join(DTYPES)}"
        )
    is_int = not dtype.is_floating_point and dtype != torch.bool
    if (spec.dtype_kind == "float" and not dtype.is_floating_point) or (
        spec.dtype_kind == "int" and not is_int
    ):
        raise PayloadError(
            f"{where}: payload key {key!r} expects {_DTYPE_KIND_WORDS[spec.dtype_kind]}, "
            f"got {dtype}"
        )
    if spec.ndim is not None and value.dim() != spec.ndim:
        raise PayloadError(
            f"{where}: payload key {key!r} expects a {spec.ndim}-d tensor "
            f"({spec.doc or spec.describe()}), got shape {tuple(value.shape)}"
        )


def validate_payload(payload: Mapping[str, Any], *, where: str) -> None:
    """Raise PayloadError naming the key, the expectation and the value if `payload` is off-schema."""
    if not isinstance(payload, Mapping):
        raise PayloadError(f"{where}: a payload must be a dict, got {type(payload).__name__}")
    for key, value in payload.items():
        spec = PAYLOAD_SCHEMA.get(key) if isinstance(key, str) else None
        if spec is None:
            close = difflib.get_close_matches(str(key), PAYLOAD_SCHEMA, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise PayloadError(
                f"{where}: unknown payload key {key!r}{hint} "
                "(declare new keys with register_payload_key)"
            )
        _check_value(key, spec, value, where)


class _Entry(msgspec.Struct, array_like=True, frozen=True):
    key: str
    kind: str
    value: int | float | bool | str | None = None
    dtype: str = ""
    shape: list[int] = []
    offset: int = 0
    nbytes: int = 0


class _Header(msgspec.Struct, array_like=True, frozen=True):
    version: int
    entries: list[_Entry]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Header)


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class PackedPayload:
    """A validated payload laid out for the wire; write it into any buffer of `nbytes`.

    Lets a connector size a destination (a shared-memory segment) first and then
    copy each tensor once, straight into it.
    """

    def __init__(self, payload: Mapping[str, Any], *, where: str = "pack_payload") -> None:
        validate_payload(payload, where=where)
        entries: list[_Entry] = []
        self._tensors: list[tuple[int, memoryview]] = []
        end = 0
        for key, value in payload.items():
            if not isinstance(value, torch.Tensor):
                kind = PAYLOAD_SCHEMA[key].kind
                entries.append(_Entry(key, kind, value))
                continue
            data = tensor_view_bytes(value)
            offset = _align(end)
            dtype = DTYPE_NAMES[value.dtype]
            entries.append(
                _Entry(key, "tensor", None, dtype, list(value.shape), offset, data.nbytes)
            )
            self._tensors.append((offset, data))
            end = offset + data.nbytes
        try:
            self._header = _encoder.encode(_Header(_FORMAT_VERSION, entries))
        except OverflowError as exc:
            raise PayloadError(f"{where}: a scalar does not fit in 64 bits: {exc}") from None
        self._data_start = _align(_HEADER_LEN.size + len(self._header))
        self.nbytes = self._data_start + end
        """Length of the packed buffer in bytes."""

    def write_into(self, buffer: memoryview | bytearray) -> None:
        """Write the packed payload into the first `nbytes` of `buffer`."""
        with memoryview(buffer) as raw, raw.cast("B") as out:
            if out.nbytes < self.nbytes:
                raise ValueError(f"buffer of {out.nbytes} bytes is too small for {self.nbytes}")
            _HEADER_LEN.pack_into(out, 0, len(self._header))
            out[_HEADER_LEN.size : _HEADER_LEN.size + len(self._header)] = self._header
            for offset, data in self._tensors:
                start = self._data_start + offset
                out[start : start + data.nbytes] = data

    def to_bytes(self) -> bytes:
        parts: list[Any] = [_HEADER_LEN.pack(len(self._header)), self._header]
        pos = _HEADER_LEN.size + len(self._header)
        for offset, data in self._tensors:
            start = self._data_start + offset
            parts += [bytes(start - pos), data]
            pos = start + data.nbytes
        parts.append(bytes(self.nbytes - pos))
        return b"".join(parts)


def pack_payload(payload: Mapping[str, Any], *, where: str = "pack_payload") -> bytes:
    """Validate `payload` and serialize it into one contiguous buffer (format: module doc)."""
    return PackedPayload(payload, where=where).to_bytes()


def payload_nbytes(payload: Mapping[str, Any]) -> int:
    """The exact length of ``pack_payload(payload)``, without copying any tensor."""
    return PackedPayload(payload, where="payload_nbytes").nbytes


def _entry_tensor(
    entry: _Entry, data: memoryview, where: str, shared: tuple[Any, int] | None = None
) -> torch.Tensor:
    """The tensor of `entry`: a copy out of `data`, or with `shared` = (the writable buffer
    object, where its data starts) a view of that buffer, which it keeps alive."""
    dtype = DTYPES.get(entry.dtype)
    if dtype is None:
        raise PayloadError(f"{where}: key {entry.key!r} has unknown dtype {entry.dtype!r}")
    numel = 1
    for dim in entry.shape:
        if dim < 0:
            raise PayloadError(f"{where}: key {entry.key!r} has a negative dim {entry.shape}")
        numel *= dim
    expected = numel * dtype.itemsize
    if entry.nbytes != expected or entry.offset < 0 or entry.offset + expected > data.nbytes:
        raise PayloadError(
            f"{where}: key {entry.key!r} ({entry.dtype}{entry.shape}) does not fit the buffer"
        )
    if shared is not None and numel:
        base, data_start = shared
        flat = torch.frombuffer(base, dtype=dtype, count=numel, offset=data_start + entry.offset)
        return flat.view(entry.shape)
    with data[entry.offset : entry.offset + expected] as src:
        return tensor_copy_from(src, dtype, entry.shape)


def unpack_payload(
    buffer: bytes | memoryview | mmap.mmap, *, where: str = "unpack_payload", views: bool = False
) -> Payload:
    """Decode and validate a packed payload. Tensors are copies (`buffer` may be freed
    after), or with `views` views of `buffer` (a writable object exporting the buffer
    protocol, e.g. a private mapping of a shared-memory segment), which they keep alive:
    the payload is read without a copy."""
    with memoryview(buffer) as raw, raw.cast("B") as mv:
        if mv.nbytes < _HEADER_LEN.size:
            raise PayloadError(f"{where}: buffer of {mv.nbytes} bytes is too short")
        (header_len,) = _HEADER_LEN.unpack_from(mv, 0)
        data_start = _align(_HEADER_LEN.size + header_len)
        if _HEADER_LEN.size + header_len > mv.nbytes:
            raise PayloadError(f"{where}: header of {header_len} bytes overruns the buffer")
        try:
            with mv[_HEADER_LEN.size : _HEADER_LEN.size + header_len] as raw_header:
                header = _decoder.decode(raw_header)
        except msgspec.DecodeError as exc:
            raise PayloadError(f"{where}: bad payload header: {exc}") from None
        if header.version != _FORMAT_VERSION:
            raise PayloadError(f"{where}: payload format version {header.version} is unknown")
        payload: Payload = {}
        shared = (buffer, data_start) if views else None
        with mv[min(data_start, mv.nbytes) :] as data:
            end = 0
            for entry in header.entries:
                if entry.key in payload:
                    raise PayloadError(f"{where}: key {entry.key!r} appears twice")
                if entry.kind == "tensor":
                    payload[entry.key] = _entry_tensor(entry, data, where, shared)
                    end = max(end, entry.offset + entry.nbytes)
                else:
                    payload[entry.key] = entry.value  # type: ignore[assignment]
            if data_start + end != mv.nbytes:
                raise PayloadError(
                    f"{where}: buffer is {mv.nbytes} bytes, the header describes {data_start + end}"
                )
    validate_payload(payload, where=where)
    return payload


__all__ = [
    "KeySpec",
    "PAYLOAD_SCHEMA",
    "PackedPayload",
    "Payload",
    "PayloadError",
    "TensorBlob",
    "blob_to_tensor",
    "pack_payload",
    "payload_nbytes",
    "register_payload_key",
    "tensor_to_blob",
    "unpack_payload",
    "validate_payload",
]
