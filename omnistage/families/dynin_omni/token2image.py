"""Dynin-Omni's token2image stage: a request whose tokens are image codes (`detok_id`
image) is drawn by the MAGVITv2 decoder; any other request's tokens pass through
unchanged to the next stage (the reference's token2image does the same), with their
metadata.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import torch

from omnistage.families.dynin_omni.config import VQ_IMAGE_DIR, DyninOmniConfig
from omnistage.families.dynin_omni.magvit import MagvitConfig, VQGANDecoder, code_bits, to_pixels
from omnistage.families.dynin_omni.token2text import DETOK_IMAGE
from omnistage.models.generation import GenerationItem, GenerationModel, load_part_module


class DyninToken2Image(GenerationModel):
    architectures: ClassVar[tuple[str, ...]] = ()
    output_modality: ClassVar[str] = "image"

    def __init__(self, cfg: DyninOmniConfig, magvit: MagvitConfig, dtype: torch.dtype) -> None:
        super().__init__()
        if 2**magvit.z_channels != cfg.codebook_size:
            raise ValueError(
                f"z_channels: a {magvit.z_channels}-bit MAGVITv2 does not decode the model's "
                f"{cfg.codebook_size} image codes"
            )
        if magvit.grid**2 != cfg.num_vq_tokens:
            raise ValueError(
                f"num_vq_tokens: {cfg.num_vq_tokens} codes are no {magvit.grid}x{magvit.grid} grid"
            )
        self.cfg, self.magvit, self.dtype = cfg, magvit, dtype
        self.decoder = VQGANDecoder(magvit, dtype)

    @classmethod
    def from_checkpoint(cls, path: Path, hf_config: Any, dtype: torch.dtype) -> DyninToken2Image:
        path = Path(path)
        cfg = DyninOmniConfig.from_dict(json.loads((path / "config.json").read_text()))
        vq = path / VQ_IMAGE_DIR
        if not (vq / "config.json").is_file():
            raise ValueError(f"{path}: no MAGVITv2 image decoder ({VQ_IMAGE_DIR}/config.json)")
        magvit = MagvitConfig.from_dict(json.loads((vq / "config.json").read_text()))
        model = cls(cfg, magvit, dtype)
        load_part_module(model.decoder, vq, "decoder.", "MAGVITv2 decoder")
        return model.eval()

    def check_item(self, item: GenerationItem) -> None:
        if item.meta.get("detok_id") != DETOK_IMAGE:
            return
        codes = item.rows
        if codes.numel() != self.cfg.num_vq_tokens:
            raise ValueError(
                f"codes.audio: {codes.numel()} image codes, the decoder takes {self.cfg.num_vq_tokens}"
            )
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.cfg.codebook_size):
            raise ValueError(f"codes.audio: an image code outside [0, {self.cfg.codebook_size})")

    @torch.inference_mode()
    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        return [self._one(item) for item in items]

    def _one(self, item: GenerationItem) -> torch.Tensor:
        if item.meta.get("detok_id") != DETOK_IMAGE:
            return item.rows[: item.own_end].clone()
        z = code_bits(item.rows, self.magvit.z_channels, self.magvit.grid, self.dtype)
        return to_pixels(self.decoder(z))
