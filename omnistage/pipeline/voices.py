"""The voices (speakers) a speaking pipeline can use, read from its talker's checkpoint.

A pipeline speaks when one of its edges builds a talker's input (an edge a family
declares `voices` for), or when its entry stage is a talker that renders its own
prompt (a TTS model whose `model_type` a family declares `voices` for); its voices
are that talker checkpoint's speakers, read as the family says (Qwen3-Omni:
`talker_config.speaker_id`; Qwen2.5-Omni: `spk_dict.pt`; Qwen3-TTS:
`talker_config.spk_id`). A request names one case-insensitively (`resolve_voice`),
and every stage gets it as the checkpoint spells it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from omnistage.models import registry
from omnistage.pipeline.deploy import model_type_of
from omnistage.voice_store import VoiceStore


def _talker_edge(deploy: Any) -> tuple[Any, str] | None:
    """(the talker stage's spec, the name its voices are declared under: its edge's
    processor or its own model type), or None for a pipeline without a talker."""
    for edge in deploy.edges:
        if registry.edge_voices(edge.processor) is not None:
            return deploy.stage(edge.dst).with_part_directory(), edge.processor
    entries = deploy.entry_stages
    entry = entries[0].with_part_directory() if len(entries) == 1 else None
    if entry is not None and entry.model is not None:
        model_type = model_type_of(entry.model)
        if model_type is not None and registry.edge_voices(model_type) is not None:
            return entry, model_type
    return None


@functools.lru_cache(maxsize=16)
def _speakers_at(processor: str, model: str) -> tuple[str, ...]:
    from omnistage.models.loader import resolve_model

    read, _ = registry.edge_voices(processor)
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
    """The voice a request that names none speaks with (the family's default, else the
    checkpoint's first speaker); None without a talker or named speakers."""
    found = _talker_edge(deploy)
    if found is None:
        return None
    default = registry.edge_voices(found[1])[1]
    if default is not None:
        return default
    speakers = speakers_of(deploy)
    return speakers[0] if speakers else None


def resolve_voice(deploy: Any, voice: str | None) -> str | None:
    """`voice` as the checkpoint spells it (matched case-insensitively), None for None;
    ValueError naming `voice` (with the choices) for any other."""
    if voice is None:
        return None
    if not isinstance(voice, str):
        raise ValueError(f"voice: expected a string, got {voice!r}")
    if VoiceStore.is_voice_id(voice):
        return _uploaded(deploy, voice)
    speakers = speakers_of(deploy)
    if not speakers:
        raise ValueError(f"voice: {voice!r} given, but this pipeline has no selectable voices")
    by_lower = {s.lower(): s for s in speakers}
    if voice.lower() not in by_lower:
        raise ValueError(f"voice: {voice!r} is not one of {', '.join(sorted(by_lower))}")
    return by_lower[voice.lower()]


def voice_store(deploy: Any) -> VoiceStore | None:
    """The uploaded voices of the pipeline's entry talker (a TTS model), or None."""
    found = _talker_edge(deploy)
    if found is None or found[1] in {e.processor for e in deploy.edges}:
        return None  # no talker, or one an edge feeds (an omni model's): nothing cloned
    if not registry.clones_uploaded_voices(found[1]):
        return None
    from omnistage.models.loader import resolve_model

    return VoiceStore.for_model(resolve_model(found[0].model).path)


def _uploaded(deploy: Any, voice: str) -> str:
    store = voice_store(deploy)
    if store is None:
        raise ValueError(f"voice: {voice!r} is an uploaded voice; this pipeline clones none")
    if store.get(voice) is None:
        raise ValueError(f"voice: no uploaded voice {voice!r}")
    return voice
