"""Dynin-Omni's two hops (token2text -> token2image -> token2audio), one data plane.

Each hop's payload is seed 003's shape: the request's flattened prompt metadata as
top-level `meta.*` keys (`meta.speaker`, `meta.language`, `meta.task`,
`meta.detok_id`, `meta.prompt_length`, `meta.modalities`), the tokens as
`codes.audio` (1-D ids relative to their codebook, whatever the task: the reference
names the key so for both hops) and `meta.finished` (True: one whole payload per hop).
The consumer stage is parked (WAITING_FOR_INPUT) until it arrives; the metadata comes
back out as the consumer item's `meta` exactly as it went in, so the next hop sends it on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from omnistage.core.edge_processor import EdgeProcessor
from omnistage.core.payload import KeySpec, Payload, register_payload_key

CODES = "codes.audio"
META_KEYS: dict[str, KeySpec] = {
    "meta.speaker": KeySpec("str", doc="the request's speaker (voice)"),
    "meta.language": KeySpec("str", doc="the request's language"),
    "meta.modalities": KeySpec("str", doc="comma-separated output types the request wants"),
    "meta.task": KeySpec("str", doc="Dynin-Omni task: t2t, t2i or t2s"),
    "meta.detok_id": KeySpec(
        "int", doc="Dynin-Omni: which stage decodes (0 text, 1 image, 2 audio)"
    ),
    "meta.prompt_length": KeySpec(
        "int", doc="Dynin-Omni: prompt tokens before the generated region"
    ),
}
for _key, _spec in META_KEYS.items():
    register_payload_key(_key, _spec)


class DyninHop(EdgeProcessor):
    """One Dynin-Omni hop: tokens and flattened metadata in one whole payload."""

    input_key = CODES

    def from_generation(self, meta: Mapping[str, Any], output: torch.Tensor) -> Payload:
        payload: Payload = {CODES: output.reshape(-1).long(), "meta.finished": True}
        for name, value in meta.items():
            key = f"meta.{name}"
            if key not in META_KEYS:
                raise ValueError(f"{self.name}: metadata field {name!r} has no payload key")
            payload[key] = value
        return payload

    def to_meta(self, payload: Payload) -> dict[str, Any]:
        if payload.get("meta.finished") is not True:
            raise ValueError(
                f"{self.name}: a Dynin-Omni hop sends one whole payload (meta.finished)"
            )
        return {key[len("meta.") :]: payload[key] for key in META_KEYS if key in payload}


class DyninTextToImage(DyninHop):
    name = "dynin_token2image"


class DyninImageToAudio(DyninHop):
    name = "dynin_token2audio"
