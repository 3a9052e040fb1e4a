"""Dynin-Omni's image understanding input: an image becomes MAGVITv2 codes (`ImageCodes`,
the encoder of the checkpoint's `vq_model_image/`), and the codes and the question become
Dynin's mmu prompt as vLLM-Omni's Dynin i2t example builds it (`build_i2t_input_ids`):

    <|mmu|> <|soi|> codes + llm_vocab_size <|eoi|> <bos>  tokenizer(chat(question))

the question in Dynin's chat layout (`prompting.t2s_chat_text` without instruction:
`build_i2t_chat_prompt`), tokenized as the reference does (with the tokenizer's special
tokens). The answer is then Dynin's `mmu_generate` on it, as for text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnistage.families.dynin_omni.config import VQ_IMAGE_DIR, DyninOmniConfig
from omnistage.families.dynin_omni.magvit_encoder import (
    EncoderConfig,
    VQGANEncoder,
    lfq_codes,
    preprocess_image,
)
from omnistage.families.dynin_omni.prompting import ASSISTANT, USER
from omnistage.models.generation import load_part_module


class ImageCodes:
    """MAGVITv2's `get_code` after the reference's preprocessing."""

    def __init__(self, encoder: VQGANEncoder, resolution: int) -> None:
        self.encoder = encoder.eval()
        self.resolution = resolution

    @classmethod
    def load(cls, path: Path, resolution: int, dtype: torch.dtype) -> ImageCodes | None:
        """The encoder of `path/vq_model_image/` (its sizes under `encoder` in its
        config.json, else MAGVITv2's), or None where the folder holds no encoder weights."""
        from omnistage.models.loader import iter_weights

        vq = Path(path) / VQ_IMAGE_DIR
        if not (vq / "config.json").is_file() or not any(iter_weights(vq, ["encoder."])):
            return None
        raw = json.loads((vq / "config.json").read_text()).get("encoder", {})
        encoder = VQGANEncoder(EncoderConfig.from_dict(raw), dtype)
        load_part_module(encoder, vq, "encoder.", "MAGVITv2 encoder")
        return cls(encoder, resolution)

    @torch.inference_mode()
    def __call__(self, image: np.ndarray) -> torch.Tensor:
        """`[H, W, 3]` uint8 -> `[n]` codes (from 0)."""
        dtype = self.encoder.conv_in.weight.dtype
        pixels = preprocess_image(image, self.resolution).to(dtype)[None]
        return lfq_codes(self.encoder(pixels))[0]


def i2t_chat_text(question: str) -> str:
    """vLLM-Omni's `build_i2t_chat_prompt`."""
    return f"{USER}{question}{ASSISTANT}"


def mmu_image_prompt(
    codes: torch.Tensor, question: str, cfg: DyninOmniConfig, tokenizer: Any, special: dict
) -> torch.Tensor:
    """The ids of `build_i2t_input_ids` for one image's `codes` and the `question`."""
    chat = tokenizer(i2t_chat_text(question))["input_ids"]
    head = [cfg.mmu_token_id, special["<|soi|>"]]
    tail = [special["<|eoi|>"], int(tokenizer.bos_token_id), *chat]
    image = (codes.long() + cfg.image_start).tolist()
    return torch.tensor([*head, *image, *tail], dtype=torch.long)
