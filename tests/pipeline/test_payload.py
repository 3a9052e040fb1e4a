"""Payload schema, validation and the pickle-free wire format."""

from __future__ import annotations

import difflib
import struct

import msgspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omnistage.core.payload import (
    PAYLOAD_SCHEMA,
    KeySpec,
    PackedPayload,
    PayloadError,
    TensorBlob,
    blob_to_tensor,
    pack_payload,
    payload_nbytes,
    register_payload_key,
    tensor_to_blob,
    unpack_payload,
    validate_payload,
)
from omnistage.core.tensor_blob import DTYPES as WIRE_DTYPES

DTYPES = [
    torch.bfloat16,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]
SHAPES = [(), (0,), (5,), (3, 4), (2, 0, 3), (2, 3, 5)]

register_payload_key("test_payload.any", KeySpec("tensor", doc="any tensor, for tests"))
register_payload_key("test_payload.other", KeySpec("tensor", doc="a second tensor"))
register_payload_key("test_payload.ratio", KeySpec("float", doc="a float scalar"))


def _tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 100).to(dtype)


def _raw(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def _assert_same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for key, value in a.items():
        got = b[key]
        if isinstance(value, torch.Tensor):
            assert got.dtype == value.dtype and got.shape == value.shape, key
            assert got.is_contiguous() and got.device.type == "cpu"
            assert _raw(got) == _raw(value), key
        else:
            assert type(got) is type(value) and got == value, key


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_every_dtype_exact_bytes(dtype, shape):
    payload = {"test_payload.any": _tensor(dtype, shape), "meta.finished": True}
    buffer = pack_payload(payload)
    assert len(buffer) == payload_nbytes(payload)
    _assert_same(payload, unpack_payload(buffer))
    _assert_same(payload, unpack_payload(memoryview(buffer)))


def test_round_trip_schema_keys_scalars_and_layout():
    payload = {
        "hidden_states.output": torch.randn(7, 16, dtype=torch.bfloat16),
        "ids.output": torch.arange(7),
        "codes.audio": torch.randint(0, 1024, (4, 9), dtype=torch.int32),
        "audio.waveform": torch.randn(33, dtype=torch.float64),
        "meta.finished": False,
        "meta.chunk_index": 3,
        "meta.request_id": "req-é/1",
        "meta.text": "",
        "test_payload.ratio": -0.25,
    }
    buffer = pack_payload(payload)
    (header_len,) = struct.unpack_from("<Q", buffer)
    data_start = (8 + header_len + 63) // 64 * 64
    assert data_start % 64 == 0 and len(buffer) > data_start
    _assert_same(payload, unpack_payload(buffer))


def test_empty_payload_round_trips():
    assert unpack_payload(pack_payload({})) == {}


def test_non_contiguous_tensor_round_trips():
    t = torch.arange(24.0).reshape(4, 6).t()[1:]
    got = unpack_payload(pack_payload({"hidden_states.output": t}))["hidden_states.output"]
    assert torch.equal(got, t) and got.is_contiguous()


def test_packed_payload_write_into_equals_to_bytes():
    payload = {"test_payload.any": torch.randn(3, 5), "test_payload.other": torch.ones(2, 2)}
    packed = PackedPayload(payload)
    out = bytearray(packed.nbytes + 10)
    packed.write_into(out)
    assert bytes(out[: packed.nbytes]) == packed.to_bytes() == pack_payload(payload)
    with pytest.raises(ValueError, match="too small"):
        packed.write_into(bytearray(packed.nbytes - 1))
    exact = bytearray(packed.nbytes)  # a buffer of exactly the payload's size is enough
    packed.write_into(exact)
    assert bytes(exact) == packed.to_bytes()


def test_unpack_copies_out_of_the_buffer():
    t = torch.arange(100, dtype=torch.int64)
    buffer = bytearray(pack_payload({"ids.output": t}))
    view = memoryview(buffer)
    got = unpack_payload(view)
    view.release()
    buffer[:] = bytes(len(buffer))  # overwrite the source after unpacking
    assert torch.equal(got["ids.output"], t)


def test_views_read_the_buffer_in_place():
    """`views=True` (the shared-memory connector's path): every tensor is a view of the
    buffer, equal to the packed one; a write to the buffer shows through."""
    payload = {"ids.output": torch.arange(7), "hidden_states.output": torch.randn(3, 5)}
    buffer = bytearray(pack_payload(payload))
    got = unpack_payload(buffer, views=True)
    _assert_same(payload, got)
    ids = got["ids.output"]
    assert ids.shape == (7,) and ids.dtype == torch.int64
    offset = bytes(buffer).index(torch.arange(7).numpy().tobytes())
    buffer[offset : offset + 8] = (41).to_bytes(8, "little")
    assert ids[0].item() == 41 and got["hidden_states.output"].shape == (3, 5)
    copied = unpack_payload(bytearray(pack_payload(payload)))
    _assert_same(payload, copied)


def test_unknown_key_names_key_where_and_close_matches():
    with pytest.raises(PayloadError) as err:
        validate_payload({"hidden_state.output": torch.zeros(1, 1)}, where="talker->code2wav")
    msg = str(err.value)
    assert "'hidden_state.output'" in msg and "talker->code2wav" in msg
    assert "'hidden_states.output'" in msg


def test_unknown_key_message_whole():
    """The whole message: up to three close matches, joined, or none; and the pointer to
    register_payload_key."""
    with pytest.raises(PayloadError) as err:
        validate_payload({"ids.outpt": torch.zeros(1, dtype=torch.long)}, where="w")
    close = difflib.get_close_matches("ids.outpt", PAYLOAD_SCHEMA, n=3, cutoff=0.6)
    assert len(close) == 3
    hint = "; did you mean " + ", ".join(map(repr, close)) + "?"
    assert str(err.value) == (
        f"w: unknown payload key 'ids.outpt'{hint} (declare new keys with register_payload_key)"
    )
    with pytest.raises(PayloadError) as err:
        validate_payload({"zzzzzzzz": 1}, where="w")
    assert str(err.value) == (
        "w: unknown payload key 'zzzzzzzz' (declare new keys with register_payload_key)"
    )


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ({"meta.chunk_index": True}, ["'meta.chunk_index'", "int", "bool"]),
        ({"meta.finished": 1}, ["'meta.finished'", "expects bool, got int"]),
        ({"meta.text": b"x"}, ["'meta.text'", "str", "bytes"]),
        ({"test_payload.ratio": 1}, ["'test_payload.ratio'", "float", "int"]),
        ({"ids.prompt": [1, 2]}, ["'ids.prompt'", "expects 1-d int-dtype tensor", "list"]),
        ({"codes.audio": 3}, ["'codes.audio'", "expects any-d int-dtype tensor", "got int"]),
        ({"meta.chunk_index": torch.tensor(1)}, ["'meta.chunk_index'", "int", "tensor"]),
        ({"ids.prompt": torch.zeros(3)}, ["'ids.prompt'", "integer", "float32"]),
        ({"ids.prompt": torch.zeros(3, dtype=torch.bool)}, ["'ids.prompt'", "integer", "bool"]),
        (
            {"embed.prefill": torch.zeros(3, dtype=torch.int64)},
            ["'embed.prefill'", "float", "int64"],
        ),
        ({"hidden_states.output": torch.zeros(3)}, ["'hidden_states.output'", "2-d", "(3,)"]),
        ({"ids.output": torch.zeros(2, 2, dtype=torch.long)}, ["'ids.output'", "1-d", "(2, 2)"]),
        ({"latents": torch.zeros(2, dtype=torch.complex64)}, ["'latents'", "complex64"]),
    ],
)
def test_validation_errors_name_key_expected_and_got(payload, words):
    with pytest.raises(PayloadError) as err:
        validate_payload(payload, where="here")
    for word in [*words, "here"]:
        assert word in str(err.value)
    with pytest.raises(PayloadError):
        pack_payload(payload)


def test_payload_must_be_a_dict_with_str_keys():
    with pytest.raises(PayloadError, match="dict"):
        validate_payload([("meta.text", "x")], where="w")  # type: ignore[arg-type]
    with pytest.raises(PayloadError, match="unknown payload key 3"):
        validate_payload({3: "x"}, where="w")  # type: ignore[dict-item]


def test_register_payload_key_rules():
    spec = KeySpec("tensor", "int", 2, "test")
    register_payload_key("test_payload.codes_2d", spec)
    register_payload_key("test_payload.codes_2d", KeySpec("tensor", "int", 2, "test"))  # same: ok
    assert PAYLOAD_SCHEMA["test_payload.codes_2d"] == spec
    with pytest.raises(ValueError, match="already registered"):
        register_payload_key("test_payload.codes_2d", KeySpec("tensor", "int", 3))
    for bad in ["nodots", "Upper.case", "a..b", "a.b-c", ".a.b", "a.b."]:
        with pytest.raises(ValueError, match="dotted"):
            register_payload_key(bad, spec)
    with pytest.raises(ValueError, match="kind"):
        KeySpec("list")
    with pytest.raises(ValueError, match="dtype_kind"):
        KeySpec("tensor", "complex")
    only_tensors = "KeySpec.dtype_kind and KeySpec.ndim apply to tensor keys only"
    for bad_scalar in [{"ndim": 1}, {"dtype_kind": "float"}, {"ndim": 0}]:
        with pytest.raises(ValueError) as err:
            KeySpec("int", **bad_scalar)
        assert str(err.value) == only_tensors
    assert KeySpec("int", "any").ndim is None and KeySpec("tensor", ndim=0).ndim == 0
    for bad_ndim in [-1, 1.5, True, "2"]:
        with pytest.raises(ValueError) as err:
            KeySpec("tensor", ndim=bad_ndim)  # type: ignore[arg-type]
        assert str(err.value) == f"KeySpec.ndim must be None or an int >= 0, got {bad_ndim!r}"
    with pytest.raises(TypeError) as err:
        register_payload_key("test_payload.loose", "tensor")  # type: ignore[arg-type]
    assert (
        str(err.value)
        == "spec for payload key 'test_payload.loose' must be a KeySpec, got 'tensor'"
    )


@pytest.mark.parametrize("first", [1, 64], ids=["one-byte", "one-block"])
def test_the_wire_layout_aligns_the_data_and_each_tensor_to_64_bytes(first):
    """8-byte length + a 77-byte header, padded to 128; the first tensor at data offset 0,
    the next at the first multiple of 64 after it (64 for both a 1- and a 64-byte tensor)."""
    payload = {
        "test_payload.any": torch.arange(first, dtype=torch.uint8),
        "test_payload.other": torch.tensor([200], dtype=torch.uint8),
    }
    packed = pack_payload(payload)
    assert struct.unpack_from("<Q", packed, 0) == (77,)
    assert len(packed) == payload_nbytes(payload) == 128 + 64 + 1
    assert packed[128 + 64] == 200
    got = unpack_payload(packed)
    assert all(torch.equal(got[k], v) for k, v in payload.items())


def test_pack_errors_name_where_and_what():
    with pytest.raises(PayloadError, match="^pack_payload: a scalar does not fit in 64 bits"):
        pack_payload({"meta.chunk_index": 2**64})
    with pytest.raises(PayloadError, match="^pack_payload: unknown payload key"):
        pack_payload({"no.such_key": 1})
    with pytest.raises(PayloadError, match="^pack_payload: unknown payload key"):
        PackedPayload({"no.such_key": 1})
    with pytest.raises(PayloadError, match="^edge a->b: unknown payload key"):
        pack_payload({"no.such_key": 1}, where="edge a->b")
    with pytest.raises(PayloadError, match="^w: a payload must be a dict, got list$"):
        validate_payload([], where="w")  # type: ignore[arg-type]
    with pytest.raises(PayloadError) as err:
        validate_payload({"latents": torch.zeros(2, dtype=torch.complex64)}, where="w")
    assert str(err.value).endswith("supported: " + ", ".join(WIRE_DTYPES))
    with pytest.raises(PayloadError, match=r"\(\[positions, hidden\] hidden states of output"):
        validate_payload({"hidden_states.output": torch.zeros(3)}, where="w")


def test_payload_nbytes_names_itself_in_its_errors():
    with pytest.raises(PayloadError, match="^payload_nbytes: .*'no.such_key'"):
        payload_nbytes({"no.such_key": 1})


def test_schema_has_the_documented_keys():
    for key, kind, ndim in [
        ("hidden_states.output", "float", 2),
        ("embed.prefill", "float", 2),
        ("ids.prompt", "int", 1),
        ("codes.audio", "int", None),
        ("audio.waveform", "float", 1),
        ("latents", "float", None),
    ]:
        spec = PAYLOAD_SCHEMA[key]
        assert (spec.kind, spec.dtype_kind, spec.ndim) == ("tensor", kind, ndim)
    for key in ["meta.finished", "meta.chunk_index", "meta.request_id", "meta.source_stage"]:
        assert PAYLOAD_SCHEMA[key].kind in ("bool", "int", "str")


def test_unpack_rejects_bad_buffers():
    good = pack_payload({"ids.output": torch.arange(5), "meta.finished": True})
    for bad in [b"", good[:7], good[:-1], good + b"\0", b"\xff" * 8 + good[8:]]:
        with pytest.raises(PayloadError):
            unpack_payload(bad)
    # A header that passes decoding but describes an off-schema payload is refused too.
    header = msgspec.msgpack.encode([1, [["meta.finished", "int", 1, "", [], 0, 0]]])
    raw = struct.pack("<Q", len(header)) + header
    raw += bytes((len(raw) + 63) // 64 * 64 - len(raw))
    with pytest.raises(PayloadError, match="^receive: payload key 'meta.finished' expects bool"):
        unpack_payload(raw, where="receive")


def _laid_out(entries: list, data: bytes = b"", pad: bool = True, version: int = 1) -> bytes:
    """A buffer with this header (entries as the wire's arrays) and data after it."""
    header = msgspec.msgpack.encode([version, entries])
    raw = struct.pack("<Q", len(header)) + header
    if pad:
        raw += bytes((len(raw) + 63) // 64 * 64 - len(raw))
    return raw + data


@pytest.mark.parametrize(
    ("buffer", "message"),
    [
        (b"", "unpack_payload: buffer of 0 bytes is too short"),
        (b"\0" * 7, "unpack_payload: buffer of 7 bytes is too short"),
        (struct.pack("<Q", 0), "unpack_payload: bad payload header"),
        (struct.pack("<Q", 100) + b"x" * 10, "unpack_payload: header of 100 bytes overruns"),
        (_laid_out([], version=2), "unpack_payload: payload format version 2 is unknown"),
        (
            _laid_out([["ids.output", "tensor", None, "int64", [2], 0, 16]], bytes(17)),
            "unpack_payload: buffer is 81 bytes, the header describes 80",
        ),
        (
            _laid_out([["meta.text", "str", "a"], ["meta.text", "str", "b"]]),
            "unpack_payload: key 'meta.text' appears twice",
        ),
        (
            _laid_out([["ids.output", "tensor", None, "int128", [2], 0, 16]], bytes(64)),
            "unpack_payload: key 'ids.output' has unknown dtype 'int128'",
        ),
        (
            _laid_out([["ids.output", "tensor", None, "int64", [-2], 0, 0]], bytes(64)),
            "unpack_payload: key 'ids.output' has a negative dim [-2]",
        ),
        (
            _laid_out([["ids.output", "tensor", None, "int64", [2], 0, 8]], bytes(64)),
            "unpack_payload: key 'ids.output' (int64[2]) does not fit the buffer",
        ),
        (
            _laid_out([["ids.output", "tensor", None, "int64", [2], 56, 16]], bytes(64)),
            "unpack_payload: key 'ids.output' (int64[2]) does not fit the buffer",
        ),
    ],
)
def test_unpack_names_what_is_wrong_with_a_buffer(buffer, message):
    with pytest.raises(PayloadError) as err:
        unpack_payload(buffer)
    assert str(err.value).startswith(message)


def test_a_header_that_ends_the_buffer_exactly_unpacks():
    """Scalars only, the header filling the buffer to its last byte (no data, no padding)."""
    text = next(
        "x" * n
        for n in range(64)
        if len(_laid_out([["meta.text", "str", "x" * n]], pad=False)) % 64 == 0
    )
    raw = _laid_out([["meta.text", "str", text]], pad=False)
    assert unpack_payload(raw) == {"meta.text": text}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tensor_blob_round_trip(dtype):
    t = _tensor(dtype, (3, 4))[:, 1:]  # non-contiguous
    blob = tensor_to_blob(t)
    assert isinstance(blob, TensorBlob) and blob.shape == [3, 3]
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(blob), type=TensorBlob)
    got = blob_to_tensor(decoded)
    assert got.dtype == dtype and _raw(got) == _raw(t)
    assert blob_to_tensor(tensor_to_blob(torch.tensor(5))).shape == ()
    with pytest.raises(ValueError, match=r"^tensor blob float32\[2\] needs 8 bytes, got 7$"):
        blob_to_tensor(TensorBlob("float32", [2], b"\0" * 7))
    with pytest.raises(ValueError, match=r"^unsupported tensor dtype torch.complex64$"):
        tensor_to_blob(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match=r"^unsupported tensor dtype 'complex64'$"):
        blob_to_tensor(TensorBlob("complex64", [2], b"\0" * 16))


_scalar_values = {
    "meta.finished": st.booleans(),
    "meta.chunk_index": st.integers(-(2**63), 2**63 - 1),
    "meta.text": st.text(max_size=20),
    "test_payload.ratio": st.floats(allow_nan=False),
}


@st.composite
def _payloads(draw):
    payload = {}
    for key in draw(st.lists(st.sampled_from(sorted(_scalar_values)), unique=True)):
        payload[key] = draw(_scalar_values[key])
    for key in draw(
        st.lists(st.sampled_from(["test_payload.any", "test_payload.other"]), unique=True)
    ):
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        dtype = draw(st.sampled_from(DTYPES))
        payload[key] = _tensor(dtype, shape, seed=draw(st.integers(0, 1000)))
    return payload


@settings(max_examples=60, deadline=None)
@given(_payloads())
def test_random_payloads_round_trip(payload):
    buffer = pack_payload(payload)
    assert len(buffer) == payload_nbytes(payload)
    _assert_same(payload, unpack_payload(buffer))
