"""Dynin-Omni's token2text stage: the LLaDA model writes a request's answer tokens by
masked diffusion, and names which decoder they are for (`detok_id`).

The task follows from what the request wants out (`GenerationItem.meta["modalities"]`,
the output types of its final stages): audio -> text-to-speech units, image -> text-to-
image codes, otherwise text. Each task appends a masked region to the prompt and fills
it (text greedily, `unmask.fill_masks`; image codes and speech units sampled from the
request's seed, `sampled_fill`):

    text:  prompt  [mask] * text_max_new_tokens     (Dynin's mmu_generate on the prompt ids:
           a chat arrives in the tokenizer's chat template, as vLLM-Omni's t2t renders it)
    image: Dynin's t2i_gen template of the prompt, <|soi|> masks <|eoi|>, guided against
           the empty text's template (`image_guidance_scale`)
    audio: Dynin's t2s_gen template of the chat-wrapped prompt, <|soa|> masks, guided
           against the speech region all masked (`audio_cfg_scale`)

(see `prompting`; the templates' padding is hidden by LLaDA's attention mask). An image or
speech request that arrives as a rendered chat takes its user text (`task_text`), as
vLLM-Omni's online path does. The loops are the reference's (see `unmask`, `sampled_fill`).

The output is the region's ids relative to their codebook (image codes from 0, speech
units from 0, cut at the first <|eoa|>; text ids cut at the first end of text), and the
item's metadata gains `task`, `detok_id` and `prompt_length`, which the edges carry on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.families.dynin_omni.config import DyninOmniConfig
from omnistage.families.dynin_omni.image_input import ImageCodes, mmu_image_prompt
from omnistage.families.dynin_omni.llada import LLaDAModelLM
from omnistage.families.dynin_omni.prompting import (
    ASSISTANT_HEADER,
    chat_user_text,
    gen_prompt,
    t2s_chat_text,
)
from omnistage.families.dynin_omni.sampled_fill import maskgit_image, speech_units
from omnistage.families.dynin_omni.speech_input import SpeechUnits, s2t_prompt
from omnistage.families.dynin_omni.unmask import fill_masks
from omnistage.models.generation import GenerationItem, GenerationModel, load_part_module

DETOK_TEXT, DETOK_IMAGE, DETOK_AUDIO = 0, 1, 2
"""`detok_id`: which stage decodes the tokens (text, token2image, token2audio)."""


def task_of(meta: dict[str, Any]) -> str:
    """The task of a request wanting `meta["modalities"]` (text when not said). Dynin-Omni
    writes one modality per request: text beside image or audio (a chat asking for audio
    out) is the other one's task, whose text output is empty; ValueError for two non-text
    outputs."""
    wanted = [m for m in str(meta.get("modalities", "")).split(",") if m]
    if len(wanted) > 1:
        wanted = [m for m in wanted if m != "text"]
    if len(wanted) > 1:
        raise ValueError(
            f"modalities: Dynin-Omni writes one output per request (text, image or audio; "
            f"text beside one of the others); asked for {', '.join(wanted)}"
        )
    return {"audio": "t2s", "image": "t2i"}.get(wanted[0] if wanted else "text", "t2t")


class DyninToken2Text(GenerationModel):
    architectures: ClassVar[tuple[str, ...]] = ()
    output_modality: ClassVar[str] = "tokens"
    takes_prompts: ClassVar[bool] = True
    takes_seeds_and_speakers: ClassVar[bool] = True
    """Image codes and speech units are sampled from the request's seed (text is greedy)."""

    def __init__(self, cfg: DyninOmniConfig, tokenizer: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.lm = LLaDAModelLM(cfg, dtype)
        self.image_codes: ImageCodes | None = None
        """MAGVITv2's encoder, for image understanding (`image_prompt`), when present."""
        self.speech_units: SpeechUnits | None = None
        """EMOVA's S2U encoder, for speech understanding (`take_audios`), when present."""
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
        model.image_codes = ImageCodes.load(Path(path), cfg.mmu_image_resolution, dtype)
        model.speech_units = SpeechUnits.load(Path(path), cfg, dtype)
        return model.eval()

    def prompt_rows(self, prompt: str | None, prompt_token_ids: list[int] | None) -> torch.Tensor:
        if prompt_token_ids is None:
            if prompt is None:
                raise ValueError("prompt: the prompt is empty")
            # "" is refused by `check_item` unless media (a speech clip) fills the rows.
            prompt_token_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        return torch.tensor(list(prompt_token_ids), dtype=torch.long)

    def output_text(self, item: GenerationItem, output: torch.Tensor) -> str:
        if item.meta.get("task") != "t2t":
            return ""
        return self.tokenizer.decode(output.tolist(), skip_special_tokens=True)

    def check_item(self, item: GenerationItem) -> None:
        ids = item.rows
        if ids.numel() == 0:
            raise ValueError("prompt: the prompt is empty")
        bad = ids[(ids < 0) | (ids >= self.cfg.llm_vocab_size)]
        if bad.numel() and not (item.meta.get("image_prompt") or item.meta.get("speech_prompt")):
            raise ValueError(f"prompt_token_ids: {int(bad[0])} is no text id of this model")
        c, task = self.cfg, task_of(item.meta)
        if task != "t2t" and self.task_text(ids).numel() == 0:
            raise ValueError("prompt: the prompt has no text")
        # Image and speech prompts are padded or cut to their templates' max_text_len + 1.
        answer = c.s2t_max_new_tokens if item.meta.get("speech_prompt") else c.text_max_new_tokens
        total = {
            "t2t": ids.numel() + answer,
            "t2i": c.t2i_max_text_len + 3 + c.num_vq_tokens,
        }.get(task, c.t2s_max_text_len + 2 + c.audio_max_new_tokens)
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
        if task != "t2t":
            prompt = self.task_text(prompt)
        generator = torch.Generator().manual_seed(0 if item.seed is None else int(item.seed))
        if item.meta.get("speech_prompt"):
            out = self._text(prompt, generator, "s2t")
        else:
            out = {"t2t": self._text, "t2i": self._image, "t2s": self._speech}[task](
                prompt, generator
            )
        detok = {"t2t": DETOK_TEXT, "t2i": DETOK_IMAGE, "t2s": DETOK_AUDIO}[task]
        item.meta.update(task=task, detok_id=detok, prompt_length=int(prompt.numel()))
        return out

    def _text(
        self, prompt: torch.Tensor, generator: torch.Generator, settings: str = "text"
    ) -> torch.Tensor:
        """`mmu_generate` with the text settings, or the s2t ones for a speech question."""
        c, n = self.cfg, getattr(self.cfg, f"{settings}_max_new_tokens")
        x = fill_masks(
            self.lm,
            torch.cat([prompt, self._masks(n)]),
            prompt.numel(),
            n,
            mask_id=c.mask_token_id,
            block_length=getattr(c, f"{settings}_block_length"),
            steps=getattr(c, f"{settings}_steps"),
        )
        answer = x[prompt.numel() :]
        ends = (answer == c.eos_token_id).nonzero()
        return answer[: int(ends[0])] if ends.numel() else answer

    def _image(self, prompt: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        c, n = self.cfg, self.cfg.num_vq_tokens
        ids, mask, uncond, uncond_mask = self.image_prompts(prompt)
        text_end, scale = c.t2i_max_text_len + 1, c.image_guidance_scale

        def logits(x: torch.Tensor) -> torch.Tensor:
            if scale <= 0.0:
                return self.lm(x, mask[None])
            # The guidance sequence: the empty text's template, then the image region so far.
            both = torch.cat([x, torch.cat([uncond[None, :text_end], x[:, text_end:]], 1)])
            cond, unguided = self.lm(both, torch.stack([mask, uncond_mask])).chunk(2, dim=0)
            return (1 + scale) * cond - scale * unguided

        return maskgit_image(
            logits,
            ids,
            num_codes=n,
            code_start=c.image_start,
            codebook_size=c.codebook_size,
            mask_id=c.mask_token_id,
            steps=c.image_steps,
            temperature=c.image_temperature,
            generator=generator,
        )

    def task_text(self, prompt: torch.Tensor) -> torch.Tensor:
        """The text of an image or speech request: the user text of a prompt rendered as a
        chat (`chat_user_text`, re-tokenized), any other prompt as it is."""
        decoded = self.tokenizer.decode(prompt.tolist(), skip_special_tokens=False)
        if ASSISTANT_HEADER not in decoded:
            return prompt
        ids = self.tokenizer.encode(chat_user_text(decoded), add_special_tokens=False)
        return torch.tensor(ids, dtype=torch.long)

    def take_images(self, item: GenerationItem, images: list[Any]) -> None:
        """A text request about one image: its rows become the mmu image prompt."""
        if len(images) != 1:
            raise ValueError(
                f"multi_modal_data: Dynin-Omni takes one image per request, got {len(images)}"
            )
        if task_of(item.meta) != "t2t":
            raise ValueError("modalities: Dynin-Omni answers about an image in text only")
        item.rows = self.image_prompt(images[0], item.rows)
        item.meta["image_prompt"] = 1

    def take_audios(self, item: GenerationItem, audios: list[Any]) -> None:
        """A text request about one 16 kHz clip: its rows become the s2t prompt (the
        request's text as the instruction, `s2t_instruction` where it has none)."""
        if len(audios) != 1:
            raise ValueError(
                f"multi_modal_data: Dynin-Omni takes one audio clip per request, got {len(audios)}"
            )
        if item.meta.get("image_prompt"):
            raise ValueError("multi_modal_data: Dynin-Omni takes an image or an audio, not both")
        if task_of(item.meta) != "t2t":
            raise ValueError("modalities: Dynin-Omni answers about speech in text only")
        if self.speech_units is None:
            raise ValueError(
                "multi_modal_data: this checkpoint has no speech-to-unit encoder (s2u/)"
            )
        text = self.task_text(item.rows) if item.rows.numel() else item.rows
        instruction = self.tokenizer.decode(text.tolist()).strip() or self.cfg.s2t_instruction
        units = self.speech_units(audios[0])
        item.rows = s2t_prompt(units, instruction, self.cfg, self.tokenizer, self.special)
        item.meta["speech_prompt"] = 1

    def image_prompt(self, image: np.ndarray, prompt: torch.Tensor) -> torch.Tensor:
        """Dynin's mmu prompt of an `[H, W, 3]` uint8 image and the request's prompt (its user
        text where it is a rendered chat): see `image_input`. Its answer is `generate` of a
        text item with these ids."""
        if self.image_codes is None:
            raise ValueError(
                "multi_modal_data: this checkpoint has no MAGVITv2 image encoder "
                "(encoder.* weights in vq_model_image/)"
            )
        question = self.tokenizer.decode(self.task_text(prompt).tolist())
        codes = self.image_codes(image)
        return mmu_image_prompt(codes, question, self.cfg, self.tokenizer, self.special)

    def speech_prompt(self, prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, attention mask) of a speech request: the prompt in vLLM-Omni's chat wrapping
        after the instruction, in Dynin's `t2s_gen` template (see `prompting`)."""
        head, tail = (
            self.tokenizer.encode(part, add_special_tokens=False)
            for part in t2s_chat_text("\0", self.cfg.t2s_instruction).split("\0")
        )
        ids = [*head, *prompt.tolist(), *tail]
        return self._template(ids, self.cfg.audio_max_new_tokens, "t2s")

    def image_prompts(self, prompt: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(ids, mask, guidance ids, guidance mask) of an image request: Dynin's `t2i_gen`
        template of the prompt, and of an empty text (see `prompting`)."""
        n = self.cfg.num_vq_tokens
        return (*self._template(prompt.tolist(), n, "t2i"), *self._template([], n, "t2i"))

    def _template(self, text: list[int], n: int, task: str) -> tuple[torch.Tensor, torch.Tensor]:
        c, speech = self.cfg, task == "t2s"
        return gen_prompt(
            text,
            n,
            task_id=c.t2s_token_id if speech else c.t2i_token_id,
            bos_id=int(self.tokenizer.bos_token_id),
            eos_id=c.eos_token_id,
            start_id=self.special["<|soa|>" if speech else "<|soi|>"],
            end_id=None if speech else self.special["<|eoi|>"],
            pad_id=c.ipad_token_id,
            mask_id=c.mask_token_id,
            max_text_len=c.t2s_max_text_len if speech else c.t2i_max_text_len,
        )

    def _speech(self, prompt: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        c, n = self.cfg, self.cfg.audio_max_new_tokens
        ids, mask = self.speech_prompt(prompt)

        def logits(x: torch.Tensor) -> torch.Tensor:
            return self.lm(x, mask.expand(x.shape[0], -1))

        return speech_units(
            logits,
            ids,
            ids.numel() - n,
            n,
            unit_start=c.audio_start,
            num_units=c.audio_codebook_size,
            eoa_id=self.special["<|eoa|>"],
            eos_id=c.eos_token_id,
            mask_id=c.mask_token_id,
            block_length=c.audio_block_length,
            steps=c.audio_steps,
            generator=generator,
            cfg_scale=c.audio_cfg_scale,
        )

    def _ids(self, token: str) -> torch.Tensor:
        return torch.tensor([self.special[token]], dtype=torch.long)

    def _masks(self, n: int) -> torch.Tensor:
        return torch.full((n,), self.cfg.mask_token_id, dtype=torch.long)
