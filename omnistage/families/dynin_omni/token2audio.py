"""Dynin-Omni's token2audio stage: the end of the chain, where the reference decodes a
request's speech units (`detok_id` audio) with EMOVA's speech tokenizer (a VITS-style
unit-to-speech decoder).

omnistage does not have that decoder yet: a request whose units need it fails here, at
once, with an error that says so (never a made-up waveform). Requests of other tasks
never reach this stage (the orchestrator only runs the stages a request's outputs need).
The stage is in the deploy so that the second hop (token2image -> token2audio) and its
consumer-side wait are real and tested.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import torch

from omnistage.families.dynin_omni.config import DyninOmniConfig
from omnistage.families.dynin_omni.token2text import DETOK_AUDIO
from omnistage.models.generation import GenerationItem, GenerationModel

MISSING = (
    "token2audio: decoding Dynin-Omni speech units needs EMOVA's speech tokenizer "
    "(unit-to-speech decoder), which omnistage does not implement yet"
)


class DyninToken2Audio(GenerationModel):
    architectures: ClassVar[tuple[str, ...]] = ()
    output_modality: ClassVar[str] = "audio"
    sample_rate = 16000

    def __init__(self, cfg: DyninOmniConfig) -> None:
        super().__init__()
        self.cfg = cfg

    @classmethod
    def from_checkpoint(cls, path: Path, hf_config: Any, dtype: torch.dtype) -> DyninToken2Audio:
        return cls(DyninOmniConfig.from_dict(json.loads((Path(path) / "config.json").read_text())))

    def check_item(self, item: GenerationItem) -> None:
        codes = item.rows
        if item.meta.get("detok_id") != DETOK_AUDIO:
            raise ValueError(
                f"token2audio: detok_id {item.meta.get('detok_id')!r} is no speech task"
            )
        if codes.numel() and (
            int(codes.min()) < 0 or int(codes.max()) >= self.cfg.audio_codebook_size
        ):
            raise ValueError(
                f"codes.audio: a speech unit outside [0, {self.cfg.audio_codebook_size})"
            )
        raise ValueError(MISSING)

    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        raise ValueError(MISSING)
