"""The edge processor contract: how one stage's output becomes the next stage's input.

A deploy file names a processor per edge (`processor: hidden_to_embeds`). A
processor declares, for the producer, which payload keys to accumulate and
how (`CONCAT` along dim 0, or `REPLACE` with the latest value; one mode per key
for all of a producer's edges, see `collected_modes`), and, for the consumer, how
a received payload (or, for `prompt` edges, the producer's final text and
tokens) becomes the consumer's input:

- AR consumers get a `StageInput` (prompt ids, optional prompt embeddings).
- Generation consumers get the payload's `input_key` tensor (e.g. codes).

The generic processors live in `omnistage/pipeline/processors.py`; a family's
own (a thinker feeding its talker) live in its folder and subclass these.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from omnistage.core.payload import Payload
from omnistage.core.stage_input import StageInput

CODES_KEY = "codes.output"
LATENTS_KEY = "latents.output"
"""`[frames, width]` the float row sampled with each output token (`token_codes_are_floats`)."""
IMAGE_GRID_KEY = "mm.image_grid_thw"
"""The `[images, 3]` patch grids of a prompt with images (set by the stage that encoded it)."""
PREFILL_KEY = "embed.prefill"
"""The input rows of a prompt with images (set by the stage that encoded it)."""
CONTEXT_CODES_KEY = "codes.context"
"""Codec frames a vocoder decodes only as left context before the request's first frame
(a cloned voice's reference codes), never as output."""


class Accumulate(enum.Enum):
    CONCAT = "concat"
    """Append each step's rows along dim 0 (per position for hidden states)."""
    REPLACE = "replace"
    """Keep only the latest value."""


STEP_KEYS = frozenset({"ids.output", "hidden_states.output", CODES_KEY, LATENTS_KEY})
"""The keys a producer collects from each step it runs (`RequestAccumulator.add_step`): they
can only be CONCAT. Every other key is set once by the producing stage (the prompt ids, the
image grids, context codes): REPLACE."""


HIDDEN_STATES_ACCUMULATE: Mapping[str, Accumulate] = {
    "ids.prompt": Accumulate.REPLACE,
    "ids.output": Accumulate.CONCAT,
    "hidden_states.output": Accumulate.CONCAT,
}
"""What an edge that carries the producer's per-position hidden states collects: the prompt
ids, the output ids and one hidden row per position fed to the model."""


def collected_modes(edges: Iterable[tuple[str, Mapping[str, Accumulate]]]) -> dict[str, Accumulate]:
    """The one mode of each key a producer collects for its outgoing edges, from each edge's
    (name, processor's `accumulate`).

    A producer keeps one copy of each key for all its edges, so two edges that collect one
    key in different modes are a ValueError naming the key, both modes and both edges; so
    is a key whose mode the producer cannot honour (see `STEP_KEYS`). Checked when the
    deploy is loaded and again when an accumulator is made, never mid-request."""
    modes: dict[str, tuple[Accumulate, str]] = {}
    for edge, accumulate in edges:
        for key, mode in accumulate.items():
            first_mode, first_edge = modes.setdefault(key, (mode, edge))
            if first_mode is not mode:
                raise ValueError(
                    f"payload key {key!r} is collected by {first_mode.value} on edge "
                    f"{first_edge} but by {mode.value} on edge {edge}; a producer collects a "
                    "key one way for all its edges"
                )
    for key, (mode, edge) in modes.items():
        step_key = key in STEP_KEYS
        if step_key != (mode is Accumulate.CONCAT):
            how = "comes from every step" if step_key else "is set once by the producing stage"
            need = Accumulate.CONCAT if step_key else Accumulate.REPLACE
            raise ValueError(
                f"payload key {key!r} on edge {edge}: collected by {mode.value}, but it {how}, "
                f"so only {need.value} can collect it"
            )
    return {key: mode for key, (mode, _) in modes.items()}


@dataclass
class UpstreamResult:
    """A producer's final output, as the orchestrator saw it (for `prompt` edges)."""

    text: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    producer_model: str | None = None
    """The producer stage's checkpoint directory (for processors that need its tokenizer)."""


class EdgeProcessor:
    """Base class: subclasses set `name`, `accumulate` and the conversions they support.

    Processors are stateless; the class attributes are the declaration."""

    name: ClassVar[str] = ""
    accumulate: ClassVar[Mapping[str, Accumulate]] = {}
    """Producer side: the payload keys to collect for this edge, and how."""
    stream_key: ClassVar[str | None] = None
    """The CONCAT key whose rows are counted for stream chunks."""
    input_key: ClassVar[str | None] = None
    """For generation consumers: the payload key holding the model input."""
    reads_text: ClassVar[bool] = False
    """`prompt` edges: the consumer's prompt is built from the producer's text (so the
    producer detokenizes; see `stage_writes_text`)."""

    def bind_consumer(self, engine: Any) -> None:
        """Called once by the consuming AR stage with its engine (processors that need the
        consumer's weights or tokenizer load them here)."""

    def to_prompt(self, upstream: UpstreamResult) -> StageInput:
        raise ValueError(f"edge processor {self.name!r} does not support transfer: prompt")

    def to_input(self, payload: Payload, voice: str | None = None) -> StageInput:
        """Into an AR stage: its input from the producer's payload. `voice`: the request's
        speaker (`SubmitRequest.voice`, already validated), for processors that build a
        talker's input; others ignore it (None: the model's default)."""
        raise ValueError(f"edge processor {self.name!r} does not build AR inputs from payloads")

    def to_conditioning(
        self, payload: Payload, last: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Stream into an AR stage: a later chunk's rows, one per position it generates, and
        with the `last` chunk the fill row of every position after them (or None)."""
        raise ValueError(f"edge processor {self.name!r} does not stream into ar stages")

    def to_meta(self, payload: Payload) -> dict[str, Any]:
        """Into a generation stage: the request's metadata the payload carries (flattened
        prompt fields such as a speaker or a language), handed to the model with the input
        rows (`GenerationItem.meta`); none by default."""
        return {}

    def from_generation(self, meta: Mapping[str, Any], output: torch.Tensor) -> Payload:
        """Out of a generation stage: the payload its finished request sends on this edge,
        from the item's metadata and the model's output for it."""
        raise ValueError(f"edge processor {self.name!r} does not carry a generation stage's output")

    def to_prior_tokens(self, payload: Payload) -> torch.Tensor:
        """Into a diffusion stage: the tokens the producer generated that condition the
        image (GLM-Image's prior tokens)."""
        raise ValueError(f"edge processor {self.name!r} does not feed diffusion stages")

    def to_diffusion_input(self, payload: Payload) -> dict[str, Any]:
        """Into a diffusion stage: the `DiffusionInput` fields the payload fills (by
        default `prior_token_ids`; a processor handing over a KV cache fills
        `kv_context`)."""
        return {"prior_token_ids": self.to_prior_tokens(payload)}


class ThinkerToTalker(EdgeProcessor):
    """What the omni thinker -> talker edges share: the thinker's prompt, reply, per-position
    rows and image grids are collected; the talker input a model builds from them becomes
    the stage input."""

    accumulate = {**HIDDEN_STATES_ACCUMULATE, IMAGE_GRID_KEY: Accumulate.REPLACE}
    stream_key = "ids.output"


def talker_stage_input(talker: Any) -> StageInput:
    """A model's talker input (prompt ids and embeddings, conditioning rows and fill, 3-D
    positions) as the stage input it starts the request from."""
    return StageInput(
        prompt_token_ids=talker.prompt_token_ids,
        prompt_embeds=talker.prompt_embeds,
        conditioning=talker.conditioning,
        conditioning_fill=talker.fill,
        mm_decoder_inputs=talker.mm_decoder_inputs,
    )
