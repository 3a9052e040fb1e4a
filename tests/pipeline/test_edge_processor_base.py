"""What the `EdgeProcessor` base class does for a processor that declares nothing: every
conversion it does not support is a ValueError naming the processor and the transfer, and a
model's talker input becomes the stage input field for field."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from omnistage.core.edge_processor import EdgeProcessor, UpstreamResult, talker_stage_input


class _Bare(EdgeProcessor):
    name = "bare"


def test_each_unsupported_conversion_names_the_processor_and_what_it_cannot_do():
    bare = _Bare()
    upstream = UpstreamResult(text="hi", prompt_token_ids=[1], output_token_ids=[2])
    cases = [
        (lambda: bare.to_prompt(upstream), "does not support transfer: prompt"),
        (lambda: bare.to_input({}), "does not build AR inputs from payloads"),
        (lambda: bare.to_conditioning({}, last=True), "does not stream into ar stages"),
        (
            lambda: bare.from_generation({}, torch.zeros(1)),
            "does not carry a generation stage's output",
        ),
        (lambda: bare.to_diffusion_input({}), "does not feed diffusion stages"),
    ]
    for call, what in cases:
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value) == f"edge processor 'bare' {what}"
    assert bare.to_meta({}) == {}


def test_a_diffusion_input_is_by_default_the_payloads_prior_tokens():
    class Prior(EdgeProcessor):
        name = "prior"

        def to_prior_tokens(self, payload):
            return payload["ids.output"] + 1

    tokens = Prior().to_diffusion_input({"ids.output": torch.tensor([1, 2])})
    assert list(tokens) == ["prior_token_ids"]
    assert tokens["prior_token_ids"].tolist() == [2, 3]


def test_a_talker_input_becomes_the_stage_input_field_for_field():
    talker = SimpleNamespace(
        prompt_token_ids=[4, 5],
        prompt_embeds=torch.ones(2, 3),
        conditioning=torch.zeros(1, 3),
        fill=torch.full((3,), 2.0),
        mm_decoder_inputs=object(),
    )
    stage_input = talker_stage_input(talker)
    assert stage_input.prompt_token_ids is talker.prompt_token_ids
    assert stage_input.prompt_embeds is talker.prompt_embeds
    assert stage_input.conditioning is talker.conditioning
    assert stage_input.conditioning_fill is talker.fill
    assert stage_input.mm_decoder_inputs is talker.mm_decoder_inputs
    assert stage_input.prompt is None and stage_input.output_context is None
