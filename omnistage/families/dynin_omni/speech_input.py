"""Dynin-Omni's speech understanding input (s2t): a 16 kHz clip becomes EMOVA speech units
(`SpeechUnits`: the S2U encoder of the checkpoint's `s2u/`, see `s2u`), and the units and
the instruction become Dynin's s2t prompt as vLLM-Omni's Dynin s2t example builds it
(`build_s2t_input_ids`, the same layout as Dynin's `s2t_eval_collate_fn`):

    <|s2t|> <|soa|> units + audio_start <|eoa|>  tokenizer(chat(instruction))

`audio_start` is `llm_vocab_size + codebook_size` (vLLM-Omni's `speech_token_offset`,
`len(tokenizer) + codebook_size`); the chat is `build_s2t_chat_prompt` (Dynin's user and
assistant headers around the instruction) tokenized with the tokenizer's special tokens, as
the reference does. The instruction is the request's text, or `s2t_instruction`
("Transcribe the given audio.", the example's default) where it has none. The answer is
then Dynin's `mmu_generate` on these ids, as for text.

Units as EMOVA's `s2u_extract_unit_demo` returns them by default: one per 40 ms frame up to
the encoder's length (`batch_extract_unit`), repeated consecutive units collapsed
(`reduced=True`; `s2t_reduce_units`). Which of the two sequences Dynin's speech tokenizer
(`EMOVASpeechTokenizer.encode`, remote code not readable here) hands the prompt was not
seen; the reduced one is EMOVA's demo default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnistage.families.dynin_omni.config import DyninOmniConfig
from omnistage.families.dynin_omni.prompting import ASSISTANT, USER
from omnistage.families.dynin_omni.s2u import S2U_DIR, SpeechToUnit


class SpeechUnits:
    """A clip at the encoder's rate -> EMOVA unit ids (from 0)."""

    def __init__(self, s2u: SpeechToUnit, reduce: bool, max_seconds: float) -> None:
        self.s2u, self.reduce = s2u, reduce
        self.rate = s2u.config.features.sample_rate
        self.max_samples = int(max_seconds * self.rate)

    @classmethod
    def load(cls, path: Path, cfg: DyninOmniConfig, dtype: torch.dtype) -> SpeechUnits | None:
        """The S2U of `path/s2u/`, or None where the checkpoint has none."""
        folder = Path(path) / S2U_DIR
        if not (folder / "hparams.yaml").is_file():
            return None
        s2u = SpeechToUnit.load(folder, dtype)
        if s2u.config.codebook_size > cfg.audio_codebook_size:
            raise ValueError(
                f"s2u/hparams.yaml: {s2u.config.codebook_size} units do not fit the model's "
                f"audio_codebook_size {cfg.audio_codebook_size}"
            )
        return cls(s2u, cfg.s2t_reduce_units, cfg.s2t_max_seconds)

    def __call__(self, clip: np.ndarray) -> torch.Tensor:
        wav = np.asarray(clip)
        if wav.ndim != 1 or wav.size < 2 * self.s2u.config.features.hop_length:
            raise ValueError(
                "multi_modal_data: the audio must be a mono clip of at least "
                f"{2 * self.s2u.config.features.hop_length} samples"
            )
        if wav.size > self.max_samples:
            raise ValueError(
                f"multi_modal_data: the audio is {wav.size / self.rate:.1f} s long; Dynin-Omni "
                f"takes at most {self.max_samples / self.rate:.0f} s (s2t_max_seconds)"
            )
        if not np.isfinite(wav).all():
            raise ValueError("multi_modal_data: the audio holds NaN or infinite samples")
        units = self.s2u(torch.from_numpy(wav.astype(np.float64, copy=False)))
        if self.reduce and units.numel():
            keep = torch.ones_like(units, dtype=torch.bool)
            keep[1:] = units[1:] != units[:-1]
            units = units[keep]
        return units


def s2t_chat_text(instruction: str) -> str:
    """vLLM-Omni's `build_s2t_chat_prompt`."""
    return f"{USER}{instruction}{ASSISTANT}"


def s2t_prompt(
    units: torch.Tensor, instruction: str, cfg: DyninOmniConfig, tokenizer: Any, special: dict
) -> torch.Tensor:
    """The ids of `build_s2t_input_ids` for one clip's `units` and the `instruction`."""
    chat = tokenizer(s2t_chat_text(instruction))["input_ids"]
    head = [cfg.s2t_token_id, special["<|soa|>"]]
    speech = (units.long() + cfg.audio_start).tolist()
    return torch.tensor([*head, *speech, special["<|eoa|>"], *chat], dtype=torch.long)
