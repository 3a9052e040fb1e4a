"""Qwen3-TTS's named voices: the talker config's `spk_id` keys (config.json); a
VoiceDesign or Base checkpoint has none."""

from __future__ import annotations

import json
from pathlib import Path


def speakers(path: Path) -> list[str]:
    """The speakers of the checkpoint at `path`, as it spells them."""
    config = json.loads((path / "config.json").read_text())
    return list((config.get("talker_config") or {}).get("spk_id") or {})
