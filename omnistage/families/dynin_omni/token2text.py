"""Dynin-Omni's token2text stage: the LLaDA model writes a request's answer tokens by
masked diffusion, and names which decoder they are for (`detok_id`).

The task follows from what the request wants out (`GenerationItem.meta["modalities"]`,
the output types of its final stages): audio -> text-to-speech units, image -> text-to-
image codes, otherwise text. Each task appends a masked region to the prompt and fills
it (`unmask.fill_masks`):

    text:  prompt  [mask] * text_max_new_tokens            (any id)
    image: prompt  <|soi|> [mask] * num_vq_tokens <|eoi|>  (image codes only)
    audio: prompt  <|soa|> [mask] * audio_max_new_tokens   (speech units or <|eoa|>)

The output is the region's ids relative to their codebook (image codes from 0, speech
units from 0, cut at the first <|eoa|>; text ids cut at the first end of text), and the
item's metadata gains `task`, `detok_id` and `prompt_length`, which the edges carry on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import torch

from omnistage.families.dynin_omni.config import DyninOmniConfig
from omnistage.families.dynin_omni.llada import LLaDAModelLM
from omnistage.families.dynin_omni.unmask import fill_masks
from omnistage.models.generation import GenerationItem, GenerationModel, load_part_module

DETOK_TEXT, DETOK_IMAGE, DETOK_AUDIO = 0, 1, 2
"""`detok_id`: which stage decodes the tokens (text, token2image, token2audio)."""


def task_of(meta: dict[str, Any]) -> str:
    wanted = str(meta.get("modalities", "")).split(",")
    return "t2s" if "audio" in wanted else "t2i" if "image" in wanted else "t2t"


class DyninToken2Text(GenerationModel):
    architectures: ClassVar[tuple[str, ...]] = ()
    output_modality: ClassVar[str] = "tokens"
    takes_prompts: ClassVar[bool] = True

    def __init__(self, cfg: DyninOmniConfig, tokenizer: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.lm = LLaDAModelLM(cfg, dtype)
        self.special = {
            t: int(tokenizer.convert_tokens_to_ids(t))
            for t in ("<|soi|>", "<|eoi|>", "<|soa|>", "<|eoa|>")
        }

    @classmethod
    def from_checkpoint(cls, path: Path, hf_config: Any, dtype: torch.dtype) -> DyninToken2Text:
        from omnistage.models.registry import auto_config_and_tokenizer

        cfg = DyninOmniConfig.from_dict(json.loads((Path(path) / "config.json").read_text()))
        _, tokenizer = auto_config_and_tokenizer(Path(path), "Dynin-Omni")
        model = cls(cfg, tokenizer, dtype)
        load_part_module(model.lm, Path(path), "", "Dynin-Omni LLaDA")
        return model.eval()

    def prompt_rows(self, prompt: str | None, prompt_token_ids: list[int] | None) -> torch.Tensor:
        if prompt_token_ids is None:
            if not prompt:
                raise ValueError("prompt: the prompt is empty")
            prompt_token_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        return torch.tensor(list(prompt_token_ids), dtype=torch.long)

    def check_item(self, item: GenerationItem) -> None:
        ids = item.rows
        if ids.numel() == 0:
            raise ValueError("prompt: the prompt is empty")
        bad = ids[(ids < 0) | (ids >= self.cfg.llm_vocab_size)]
        if bad.numel():
            raise ValueError(f"prompt_token_ids: {int(bad[0])} is no text id of this model")
        region = {"t2t": self.cfg.text_max_new_tokens, "t2i": self.cfg.num_vq_tokens + 2}
        total = ids.numel() + region.get(task_of(item.meta), self.cfg.audio_max_new_tokens + 1)
        if total > self.cfg.max_sequence_length:
            raise ValueError(
                f"prompt: {ids.numel()} tokens and the generated region ({total} in all) "
                f"exceed the model's {self.cfg.max_sequence_length}"
            )

    @torch.inference_mode()
    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        # One item per model call: a request's tokens must not depend on its neighbours.
        return [self._generate_one(item) for item in items]

    def _generate_one(self, item: GenerationItem) -> torch.Tensor:
        task, prompt = task_of(item.meta), item.rows.long()
        out = {"t2t": self._text, "t2i": self._image, "t2s": self._speech}[task](prompt)
        detok = {"t2t": DETOK_TEXT, "t2i": DETOK_IMAGE, "t2s": DETOK_AUDIO}[task]
        item.meta.update(task=task, detok_id=detok, prompt_length=int(prompt.numel()))
        return out

    def _fill(self, seq: list[torch.Tensor], start: int, length: int, **kw: Any) -> torch.Tensor:
        return fill_masks(
            self.lm, torch.cat(seq), start, length, mask_id=self.cfg.mask_token_id, **kw
        )

    def _masks(self, n: int) -> torch.Tensor:
        return torch.full((n,), self.cfg.mask_token_id, dtype=torch.long)

    def _text(self, prompt: torch.Tensor) -> torch.Tensor:
        c, n = self.cfg, self.cfg.text_max_new_tokens
        x = self._fill(
            [prompt, self._masks(n)],
            prompt.numel(),
            n,
            block_length=c.text_block_length,
            steps=c.text_steps,
        )
        answer = x[prompt.numel() :]
        ends = (answer == c.eos_token_id).nonzero()
        return answer[: int(ends[0])] if ends.numel() else answer

    def _image(self, prompt: torch.Tensor) -> torch.Tensor:
        c, n = self.cfg, self.cfg.num_vq_tokens
        soi, eoi = torch.tensor([self.special["<|soi|>"]]), torch.tensor([self.special["<|eoi|>"]])
        candidates = torch.arange(c.image_start, c.image_start + c.codebook_size)
        start = prompt.numel() + 1
        x = self._fill(
            [prompt, soi, self._masks(n), eoi],
            start,
            n,
            block_length=n,
            steps=c.image_steps,
            candidates=candidates,
        )
        return x[start : start + n] - c.image_start

    def _speech(self, prompt: torch.Tensor) -> torch.Tensor:
        c, n = self.cfg, self.cfg.audio_max_new_tokens
        eoa = self.special["<|eoa|>"]
        units = torch.arange(c.audio_start, c.audio_start + c.audio_codebook_size)
        candidates = torch.cat([units, torch.tensor([eoa])])
        start = prompt.numel() + 1
        seq = [prompt, torch.tensor([self.special["<|soa|>"]]), self._masks(n)]
        x = self._fill(
            seq,
            start,
            n,
            block_length=c.audio_block_length,
            steps=c.audio_steps,
            candidates=candidates,
        )
        region = x[start:]
        ends = (region == eoa).nonzero()
        region = region[: int(ends[0])] if ends.numel() else region
        return region - c.audio_start
