"""The voices (speakers) a speaking pipeline can use, read from its talker's checkpoint.

A pipeline speaks when one of its edges builds a talker's input (the processors of
`SPEAKER_READERS`); its voices are that talker checkpoint's speakers: Qwen3-Omni's
`talker_config.speaker_id` keys (config.json), Qwen2.5-Omni's `spk_dict.pt` keys (the
talker's speaker bos token and token2wav's conditioning). A request names one
case-insensitively (`resolve_voice`), and every stage gets it as the checkpoint spells it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

QWEN3_OMNI_DEFAULT_VOICE = "ethan"
"""transformers' `Qwen3OmniMoeForConditionalGeneration.generate(speaker="Ethan")`."""
QWEN25_OMNI_DEFAULT_VOICE = "Chelsie"
"""transformers' `Qwen2_5OmniForConditionalGeneration.generate(speaker="Chelsie")`."""


def _qwen3_omni_speakers(path: Path) -> list[str]:
    config = json.loads((path / "config.json").read_text())
    return list(config["talker_config"]["speaker_id"])


def _qwen25_omni_speakers(path: Path) -> list[str]:
    import torch

    from omnistage.models.qwen25_omni_talker import SPEAKER_FILE

    return list(torch.load(path / SPEAKER_FILE, weights_only=True))


SPEAKER_READERS: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "qwen3_omni_thinker_to_talker": (_qwen3_omni_speakers, QWEN3_OMNI_DEFAULT_VOICE),
    "qwen25_omni_thinker_to_talker": (_qwen25_omni_speakers, QWEN25_OMNI_DEFAULT_VOICE),
}
"""Per edge processor that builds a talker's input: how to read the consumer checkpoint's
speakers, and its default one."""


def _talker_edge(deploy: Any) -> tuple[Any, str] | None:
    """(the talker stage's spec, its processor name), or None for a pipeline that does not
    speak through a talker."""
    for edge in deploy.edges:
        if edge.processor in SPEAKER_READERS:
            return deploy.stage(edge.dst).with_part_directory(), edge.processor
    return None


@functools.lru_cache(maxsize=16)
def _speakers_at(processor: str, model: str) -> tuple[str, ...]:
    from omnistage.models.loader import resolve_model

    read, _ = SPEAKER_READERS[processor]
    return tuple(read(Path(resolve_model(model).path)))


def speakers_of(deploy: Any) -> list[str] | None:
    """The speakers of the pipeline's talker checkpoint, as it spells them; None when the
    pipeline has no talker (nothing to choose)."""
    found = _talker_edge(deploy)
    if found is None:
        return None
    stage, processor = found
    return list(_speakers_at(processor, stage.model))


def default_voice(deploy: Any) -> str | None:
    """The voice a request that names none speaks with; None without a talker."""
    found = _talker_edge(deploy)
    return None if found is None else SPEAKER_READERS[found[1]][1]


def resolve_voice(deploy: Any, voice: str | None) -> str | None:
    """`voice` as the checkpoint spells it (matched case-insensitively), None for None;
    ValueError naming `voice` (with the choices) for any other."""
    if voice is None:
        return None
    if not isinstance(voice, str):
        raise ValueError(f"voice: expected a string, got {voice!r}")
    speakers = speakers_of(deploy)
    if speakers is None:
        raise ValueError(f"voice: {voice!r} given, but this pipeline has no selectable voices")
    by_lower = {s.lower(): s for s in speakers}
    if voice.lower() not in by_lower:
        raise ValueError(f"voice: {voice!r} is not one of {', '.join(sorted(by_lower))}")
    return by_lower[voice.lower()]
