"""`StepForward`: how a runner calls its model for one step (the pass under its forward
context). The eager one calls the model; a platform may supply another (CUDA: replaying
captured graphs of decode steps, `platforms/cuda_graphs.py`) that falls back to it."""

from __future__ import annotations

from typing import Protocol

import torch

from omnistage.layers.forward_context import forward_context
from omnistage.models.base import CausalLM
from omnistage.worker.step_inputs import StepInputs


class StepForward(Protocol):
    def __call__(
        self,
        model: CausalLM,
        inputs: StepInputs,
        embeds: torch.Tensor | None,
        deepstack: torch.Tensor | None,
    ) -> torch.Tensor:
        """The step's final hidden states, one row per scheduled token."""
        ...


def eager_forward(
    model: CausalLM,
    inputs: StepInputs,
    embeds: torch.Tensor | None,
    deepstack: torch.Tensor | None,
) -> torch.Tensor:
    """The model called on the step's inputs inside the step's forward context."""
    with forward_context(inputs.attn):
        if deepstack is None:
            return model(inputs.input_ids, inputs.positions, embeds)
        return model(inputs.input_ids, inputs.positions, embeds, deepstack=deepstack)
