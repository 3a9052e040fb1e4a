"""How a code predictor's codes are drawn: the per-code sampling metadata of a frame
(`code_predictor_metadata`: greedy rows stay greedy, sampled rows use the talker's
`code_predictor_params`, seeded by the request and (output position, code)) and the same
draws described for one C call over the whole frame (`frame_draws`, `DenseStep.frame`)."""

from __future__ import annotations

import dataclasses

import torch

from omnistage.layers.dense_step import FrameDraws
from omnistage.sample import SamplingMetadata
from omnistage.sample.metadata import SAMPLING_EPS, RowSamplingState
from omnistage.sampling_params import SamplingParams

_GREEDY = SamplingParams(temperature=0.0)
_SEED_SALT = 0x636F64655F707265  # separates the code predictor's draws from the talker's


def code_predictor_metadata(
    md: SamplingMetadata, num_codes: int, device: torch.device, params: SamplingParams
) -> list[SamplingMetadata]:
    """Per code index: the metadata of its draws (greedy rows stay greedy; random rows use
    `params`, seeded by the request and (output position, code))."""
    rows = [
        RowSamplingState(
            sampling_params=_GREEDY if p.temperature < SAMPLING_EPS else params,
            seed=(seed ^ _SEED_SALT) & ((1 << 63) - 1),
            prompt_token_ids=[],
            output_token_ids=[],
        )
        for p, seed in zip(md.sampling_params, md.seeds, strict=True)
    ]
    first = SamplingMetadata.from_requests(rows, device)
    if first.all_greedy:  # positions only seed random draws
        return [first] * num_codes
    # The draws of code j differ only in their position: the rest is built once per step.
    return [
        dataclasses.replace(
            first, output_positions=[pos * num_codes + j for pos in md.output_positions]
        )
        for j in range(num_codes)
    ]


def frame_draws(first: SamplingMetadata, positions: list[int]) -> FrameDraws | None:
    """The draws of a frame's codes (`first`: code 1's metadata from
    `code_predictor_metadata`; `positions`: the frame's output positions) for
    `DenseStep.frame`, or None where a row asks for more than temperature and top-k (top-p,
    min-p: those frames are drawn code by code). Greedy rows give the step-by-step codes;
    sampled rows are drawn by the same race from the same keys, without the softmax's
    normalization, so a near tie may go the other way than `Sampler`'s: every frame of a
    talker whose sampled parameters fit takes this path, alone or batched."""
    temperature, top_k = [], []
    for p in first.sampling_params:
        greedy = p.temperature < SAMPLING_EPS
        if not greedy and (p.top_p < 1.0 or p.min_p > 0.0):
            return None
        temperature.append(0.0 if greedy else p.temperature)
        top_k.append(0 if greedy or p.top_k <= 0 else p.top_k)
    return FrameDraws.of(temperature, top_k, first.seeds, positions)
