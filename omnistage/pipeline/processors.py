"""Edge processors: how one stage's output becomes the next stage's input.

A deploy file names a processor per edge (`processor: hidden_to_embeds`). A
processor declares, for the producer, which payload keys to accumulate and
how (`CONCAT` along dim 0, or `REPLACE` with the latest value), and, for the
consumer, how a received payload (or, for `prompt` edges, the producer's
final text and tokens) becomes the consumer's input:

- AR consumers get a `StageInput` (prompt ids, optional prompt embeddings).
- Generation consumers get the payload's `input_key` tensor (e.g. codes).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from omnistage.core.stage_input import StageInput
from omnistage.pipeline.deploy_spec import DeploySpec
from omnistage.pipeline.payload import Payload
from omnistage.pipeline.voices import QWEN3_OMNI_DEFAULT_VOICE, QWEN25_OMNI_DEFAULT_VOICE

CODES_KEY = "codes.output"
IMAGE_GRID_KEY = "mm.image_grid_thw"
"""The `[images, 3]` patch grids of a prompt with images (set by the stage that encoded it)."""


class Accumulate(enum.Enum):
    CONCAT = "concat"
    """Append each step's rows along dim 0 (per position for hidden states)."""
    REPLACE = "replace"
    """Keep only the latest value."""


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

    def to_prior_tokens(self, payload: Payload) -> torch.Tensor:
        """Into a diffusion stage: the tokens the producer generated that condition the
        image (GLM-Image's prior tokens)."""
        raise ValueError(f"edge processor {self.name!r} does not feed diffusion stages")


class TextToPrompt(EdgeProcessor):
    """The producer's text becomes the consumer's prompt (tokenized by the consumer)."""

    name = "text_to_prompt"
    reads_text = True

    def to_prompt(self, upstream: UpstreamResult) -> StageInput:
        return StageInput(prompt=upstream.text)


class IdsToPrompt(EdgeProcessor):
    """The producer's output token ids become the consumer's prompt ids."""

    name = "ids_to_prompt"

    accumulate = {"ids.output": Accumulate.CONCAT}
    stream_key = "ids.output"

    def to_prompt(self, upstream: UpstreamResult) -> StageInput:
        return StageInput(prompt_token_ids=list(upstream.output_token_ids))

    def to_input(self, payload: Payload, voice: str | None = None) -> StageInput:
        ids = payload["ids.output"]
        if ids.numel() == 0:
            raise ValueError("ids_to_prompt: the producer generated no tokens")
        return StageInput(prompt_token_ids=ids.tolist())


class HiddenToEmbeds(EdgeProcessor):
    """The producer's final hidden states become the consumer's prompt embeddings.

    The producer computed hidden states for every position it fed the model:
    the prompt and all outputs but the last. Those positions' token ids go
    along as the consumer's prompt ids (its KV cache and prefix hashes need
    them); the consumer's hidden size must equal the producer's.
    """

    name = "hidden_to_embeds"

    accumulate = {
        "ids.prompt": Accumulate.REPLACE,
        "ids.output": Accumulate.CONCAT,
        "hidden_states.output": Accumulate.CONCAT,
    }
    stream_key = "ids.output"

    def to_input(self, payload: Payload, voice: str | None = None) -> StageInput:
        hidden = payload["hidden_states.output"]
        ids = torch.cat([payload["ids.prompt"], payload["ids.output"]])[: hidden.shape[0]]
        if hidden.shape[0] == 0:
            raise ValueError("hidden_to_embeds: the payload holds no hidden states")
        return StageInput(prompt_token_ids=ids.tolist(), prompt_embeds=hidden)

    def to_conditioning(
        self, payload: Payload, last: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Streamed: the first chunk is the prompt; each later hidden state conditions one
        generated position (the consumer keeps pace with the producer)."""
        hidden = payload.get("hidden_states.output")
        return (hidden if hidden is not None else torch.zeros(0, 0)), None


class _ThinkerToTalker(EdgeProcessor):
    """What the omni thinker -> talker edges share: the thinker's prompt, reply, per-position
    rows and image grids are collected; the talker input a model builds from them becomes
    the stage input."""

    accumulate = {**HiddenToEmbeds.accumulate, IMAGE_GRID_KEY: Accumulate.REPLACE}
    stream_key = "ids.output"


def _talker_stage_input(talker: Any) -> StageInput:
    """A model's talker input (prompt ids and embeddings, conditioning rows and fill, 3-D
    positions) as the stage input it starts the request from."""
    return StageInput(
        prompt_token_ids=talker.prompt_token_ids,
        prompt_embeds=talker.prompt_embeds,
        conditioning=talker.conditioning,
        conditioning_fill=talker.fill,
        mm_decoder_inputs=talker.mm_decoder_inputs,
    )


class Qwen3OmniThinkerToTalker(_ThinkerToTalker):
    """Qwen3-Omni thinker -> talker: the talker's prompt and per-frame text rows, built from
    the thinker's prompt, reply and per-position (input embedding, `accept_hidden_layer`
    output) rows by the talker checkpoint's projections (`Qwen3OmniTalkerPrompter`).

    For a prompt with images the thinker also sends their patch grids (`IMAGE_GRID_KEY`):
    the talker then rotates its prompt with 3-D positions (`get_rope_index` over its own
    input ids, as transformers' talker does).

    The speaker is the request's voice (`SubmitRequest.voice`, one of the checkpoint's
    `talker_config.speaker_id` keys), else the model's default ("ethan")."""

    name = "qwen3_omni_thinker_to_talker"

    def __init__(self) -> None:
        self.prompter: Any = None

    def bind_consumer(self, engine: Any) -> None:
        from omnistage.models.qwen3_omni_talker_prompt import Qwen3OmniTalkerPrompter

        self.prompter = Qwen3OmniTalkerPrompter.from_checkpoint(
            engine.model_files.path, engine.config.torch_dtype
        )

    def to_input(self, payload: Payload, voice: str | None = None) -> StageInput:
        if self.prompter is None:
            raise ValueError(f"edge processor {self.name!r} feeds only an ar stage")
        talker = self.prompter.build(
            payload["ids.prompt"].tolist(),
            payload["ids.output"].tolist(),
            payload["hidden_states.output"],
            speaker=voice or QWEN3_OMNI_DEFAULT_VOICE,
            finished=bool(payload.get("meta.finished", True)),
            image_grid_thw=payload.get(IMAGE_GRID_KEY),
        )
        return _talker_stage_input(talker)

    def to_conditioning(
        self, payload: Payload, last: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Streamed: each later thinker row is one more frame's text row; the last chunk
        adds `tts_eos`, then `tts_pad` for every later frame."""
        rows = payload.get("hidden_states.output")
        return self.prompter.text_rows(rows if rows is not None else torch.zeros(0, 0), last)


class Qwen25OmniThinkerToTalker(_ThinkerToTalker):
    """Qwen2.5-Omni thinker -> talker: the talker's prompt (codec mask ids for the
    repetition penalty, thinker-width prompt embeddings with the speaker and codec rows),
    one conditioning row per reply token and the `tts_text_pad` fill, built from the
    thinker's prompt, reply and per-position (input embedding, final normed hidden) rows
    with the checkpoint's embeddings (`qwen25_talker_inputs`, `codec_rows=True`: the
    input transformers' talker builds whenever it is given an attention mask).

    For a prompt with images the thinker also sends their patch grids (`IMAGE_GRID_KEY`):
    the talker then rotates its prompt with 3-D positions (`get_rope_index` over its own
    input ids, as transformers' talker does given a mask).

    The speaker is the request's voice (`SubmitRequest.voice`, spelled as in `spk_dict.pt`),
    else the model's default ("Chelsie")."""

    name = "qwen25_omni_thinker_to_talker"

    def __init__(self) -> None:
        self.specials: Any = None

    def bind_consumer(self, engine: Any) -> None:
        from omnistage.models.qwen25_omni_talker import Qwen25TalkerSpecials

        self.specials = Qwen25TalkerSpecials.from_checkpoint(
            engine.model_files.path, engine.config.torch_dtype
        )

    def to_input(self, payload: Payload, voice: str | None = None) -> StageInput:
        from omnistage.models.qwen25_omni_talker import qwen25_talker_inputs

        if self.specials is None:
            raise ValueError(f"edge processor {self.name!r} feeds only an ar stage")
        rows = payload["hidden_states.output"]  # [positions, 2 H]: input embedding, hidden
        if rows.ndim != 2 or rows.shape[1] % 2:
            raise ValueError(
                f"{self.name}: expected [positions, 2 x thinker hidden] rows (input embedding, "
                f"final hidden state), got {list(rows.shape)}"
            )
        width = rows.shape[1] // 2
        talker = qwen25_talker_inputs(
            rows[:, :width],
            rows[:, width:],
            payload["ids.prompt"].tolist(),
            payload["ids.output"].tolist(),
            self.specials,
            speaker=voice or QWEN25_OMNI_DEFAULT_VOICE,
            image_grid_thw=payload.get(IMAGE_GRID_KEY),
        )
        return _talker_stage_input(talker)


class CodecFrames(EdgeProcessor):
    """The producer's frames of codec codes (each output token and the codes sampled with
    it, `[frames, 1 + num_token_codes]`) are what a generation stage (vocoder) decodes."""

    name = "codec_frames"

    accumulate = {CODES_KEY: Accumulate.CONCAT}
    stream_key = CODES_KEY
    input_key = CODES_KEY


class IdsToCodes(EdgeProcessor):
    """The producer's output token ids are the codes a generation stage (vocoder) decodes."""

    name = "ids_to_codes"

    accumulate = {"ids.output": Accumulate.CONCAT}
    stream_key = "ids.output"
    input_key = "ids.output"


class RecaptionToPrompt(EdgeProcessor):
    """Think -> recaption -> draw: the caption the producer wrote between `<recaption>` and
    `</recaption>` (its output tokens decoded with its own tokenizer, special tokens kept
    for the split, dropped from the caption) is what the diffusion stage draws. A producer
    that wrote no caption fails the request saying so."""

    name = "recaption_to_prompt"

    def to_prompt(self, upstream: UpstreamResult) -> StageInput:
        from omnistage.pipeline.recaption import caption_of

        return StageInput(prompt=caption_of(upstream))


class PriorTokens(EdgeProcessor):
    """Every token an autoregressive prior generated (GLM-Image's preview and image grids)
    conditions the diffusion stage that draws the image."""

    name = "prior_tokens"

    accumulate = {"ids.output": Accumulate.CONCAT}

    def to_prior_tokens(self, payload: Payload) -> torch.Tensor:
        ids = payload["ids.output"]
        if ids.numel() == 0:
            raise ValueError("prior_tokens: the prior generated no tokens")
        return ids.long()


def stage_writes_text(deploy: DeploySpec, stage: str) -> bool:
    """Whether the text of an AR stage's output is read: it is a final text output, or a
    `prompt` edge builds its consumer's prompt from it. Only such stages detokenize."""
    if deploy.stage(stage).final_output_type == "text":
        return True
    return any(
        e.transfer == "prompt" and _PROCESSORS[e.processor].reads_text
        for e in deploy.edges_from(stage)
    )


_PROCESSORS: dict[str, type[EdgeProcessor]] = {}


def register_processor(cls: type[EdgeProcessor]) -> type[EdgeProcessor]:
    if not cls.name:
        raise ValueError(f"{cls.__name__}: an edge processor needs a name")
    if _PROCESSORS.get(cls.name, cls) is not cls:
        raise ValueError(f"edge processor {cls.name!r} is already registered")
    _PROCESSORS[cls.name] = cls
    return cls


def processor_names() -> tuple[str, ...]:
    return tuple(sorted(_PROCESSORS))


def get_processor(name: str) -> EdgeProcessor:
    try:
        return _PROCESSORS[name]()
    except KeyError:
        raise ValueError(
            f"unknown edge processor {name!r}; known: {', '.join(processor_names())}"
        ) from None


for _cls in (
    TextToPrompt,
    IdsToPrompt,
    HiddenToEmbeds,
    IdsToCodes,
    CodecFrames,
    Qwen3OmniThinkerToTalker,
    Qwen25OmniThinkerToTalker,
    RecaptionToPrompt,
    PriorTokens,
):
    register_processor(_cls)
