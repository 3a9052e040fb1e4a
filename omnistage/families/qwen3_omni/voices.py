"""Qwen3-Omni's voices: the talker config's `speaker_id` keys (config.json)."""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_VOICE = "ethan"
"""transformers' `Qwen3OmniMoeForConditionalGeneration.generate(speaker="Ethan")`."""


def speakers(path: Path) -> list[str]:
    """The speakers of the checkpoint at `path`, as it spells them."""
    config = json.loads((path / "config.json").read_text())
    return list(config["talker_config"]["speaker_id"])
