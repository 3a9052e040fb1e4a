"""Dynin-Omni's token2audio stage: the end of the chain, where a request's speech units
(`detok_id` audio) become a waveform through EMOVA's unit-to-speech decoder
(`emova_u2s`, the checkpoint's `vq_model_audio/`), at the decoder's sampling rate.

The request's voice is the decoder's style condition (`u2s_style2idx`, e.g.
`gender-female_emotion-neutral_speed-normal_pitch-normal`, Dynin's default, used when the
request names none); its seed draws the decoder's noise (durations and prior), one
generator per request, so a request sounds the same alone or batched. No units (the model
ended the answer at once) give no samples. Requests of other tasks never reach this stage
(the orchestrator only runs the stages a request's outputs need).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import torch

from omnistage.families.dynin_omni.config import DyninOmniConfig
from omnistage.families.dynin_omni.emova_u2s import EmovaU2S, U2SConfig, load_emova_u2s
from omnistage.families.dynin_omni.token2text import DETOK_AUDIO
from omnistage.models.generation import GenerationItem, GenerationModel


class DyninToken2Audio(GenerationModel):
    architectures: ClassVar[tuple[str, ...]] = ()
    output_modality: ClassVar[str] = "audio"
    takes_seeds_and_speakers: ClassVar[bool] = True

    def __init__(self, cfg: DyninOmniConfig, u2s: EmovaU2S) -> None:
        super().__init__()
        self.cfg, self.u2s = cfg, u2s
        self.sample_rate = u2s.cfg.sampling_rate

    @classmethod
    def from_checkpoint(cls, path: Path, hf_config: Any, dtype: torch.dtype) -> DyninToken2Audio:
        cfg = DyninOmniConfig.from_dict(json.loads((Path(path) / "config.json").read_text()))
        return cls(cfg, load_emova_u2s(Path(path), cfg.audio_codebook_size, dtype)).eval()

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
        self.u2s.style_index(item.speaker)

    @torch.inference_mode()
    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        # One request per decoder call: its frames and noise must not depend on the others.
        return [self._one(item) for item in items]

    def _one(self, item: GenerationItem) -> torch.Tensor:
        units = item.rows[: item.own_end].long()
        if units.numel() == 0:
            return torch.zeros(0, dtype=self.u2s.style_embedding.weight.dtype)
        generator = torch.Generator().manual_seed(0 if item.seed is None else int(item.seed))
        return self.u2s.synthesize(units, self.u2s.style_index(item.speaker), generator)


def styles(path: Path) -> list[str]:
    """The style conditions of a Dynin-Omni checkpoint's speech decoder (its voices)."""
    return list(U2SConfig.read(Path(path)).style2idx)
