"""Qwen2.5-Omni's voices: the keys of the checkpoint's `spk_dict.pt` (the talker's speaker
bos token and token2wav's conditioning)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_VOICE = "Chelsie"
"""transformers' `Qwen2_5OmniForConditionalGeneration.generate(speaker="Chelsie")`."""


def speakers(path: Path) -> list[str]:
    """The speakers of the checkpoint at `path`, as it spells them."""
    import torch

    from omnistage.families.qwen25_omni.model import SPEAKER_FILE

    return list(torch.load(path / SPEAKER_FILE, weights_only=True))
