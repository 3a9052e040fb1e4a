"""`assert_same_payload`: how equivalence tests compare two payloads of one edge.

Ids, codes, metadata and every other value exactly (dtype and shape included); the float
rows a model computes over a batch (`FLOAT_ROW_KEYS`: hidden states, latent patches) of the
same shape and dtype and to float64 rounding (1e-12). A request that stops at step N is in
step N+1's batch under async scheduling (it was scheduled before the stop was known), and a
pipeline stage's batches depend on when its inputs arrive: a batch of another size may round
the other rows' matrix products differently in the last bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from omnistage.core.payload import unpack_payload

FLOAT_ROW_KEYS = frozenset({"hidden_states.output", "latents.output"})


def assert_same_payload(got: Any, expected: Any, where: object = None) -> None:
    """Raise AssertionError naming `where` and the key unless `got` equals `expected` as the
    module docstring says. Packed payloads (bytes) are unpacked first."""
    got, expected = _unpacked(got), _unpacked(expected)
    assert got.keys() == expected.keys(), where
    for name, value in expected.items():
        other = got[name]
        if isinstance(value, torch.Tensor):
            assert isinstance(other, torch.Tensor), (where, name)
            assert other.dtype == value.dtype and other.shape == value.shape, (where, name)
            if name in FLOAT_ROW_KEYS:
                torch.testing.assert_close(other, value, rtol=0, atol=1e-12)
            else:
                assert torch.equal(other, value), (where, name)
        else:
            assert other == value, (where, name)


def _unpacked(payload: Any) -> Mapping[str, Any]:
    return unpack_payload(payload) if isinstance(payload, (bytes, bytearray)) else payload
