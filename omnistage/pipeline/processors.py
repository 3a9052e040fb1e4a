"""The generic edge processors, and the lookup of any edge processor by name.

The contract (`EdgeProcessor`, what a processor declares and converts) is in
`omnistage/core/edge_processor.py`; the processors here serve any model (text,
ids, hidden states, codes, a recaption, prior tokens). A family's own
processors live in its folder and are found through the family registry.
"""

from __future__ import annotations

import torch

from omnistage.core.edge_processor import (
    CODES_KEY,
    CONTEXT_CODES_KEY,
    HIDDEN_STATES_ACCUMULATE,
    Accumulate,
    EdgeProcessor,
    UpstreamResult,
)
from omnistage.core.payload import Payload
from omnistage.core.stage_input import StageInput
from omnistage.models import registry
from omnistage.pipeline.deploy_spec import DeploySpec


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

    accumulate = HIDDEN_STATES_ACCUMULATE
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


class CodecFrames(EdgeProcessor):
    """The producer's frames of codec codes (each output token and the codes sampled with
    it, `[frames, 1 + num_token_codes]`) are what a generation stage (vocoder) decodes;
    frames the producer's request brings as context (`CONTEXT_CODES_KEY`: a cloned voice's
    reference codes) are decoded before them, as left context only."""

    name = "codec_frames"

    accumulate = {CODES_KEY: Accumulate.CONCAT, CONTEXT_CODES_KEY: Accumulate.REPLACE}
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
        e.transfer == "prompt" and processor_class(e.processor).reads_text
        for e in deploy.edges_from(stage)
    )


_GENERIC: dict[str, type[EdgeProcessor]] = {
    cls.name: cls
    for cls in (
        TextToPrompt,
        IdsToPrompt,
        HiddenToEmbeds,
        IdsToCodes,
        CodecFrames,
        RecaptionToPrompt,
        PriorTokens,
    )
}


def processor_names() -> tuple[str, ...]:
    return tuple(sorted({*_GENERIC, *registry.edge_names()}))


def processor_class(name: str) -> type[EdgeProcessor]:
    """The class of edge processor `name`: a generic one, else a family's; ValueError
    naming the known ones."""
    cls = _GENERIC.get(name) or registry.edge_class(name)
    if cls is None:
        raise ValueError(f"unknown edge processor {name!r}; known: {', '.join(processor_names())}")
    return cls


def get_processor(name: str) -> EdgeProcessor:
    return processor_class(name)()
