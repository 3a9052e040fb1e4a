"""The input modalities of the omni models: their names, a model's placeholder tokens per
modality (`MediaTokens`), what a checkpoint's config accepts besides text
(`thinker_modalities`) and the check that names what it does not (`check_modalities`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

MODALITIES = ("audio", "image")


@dataclass(frozen=True)
class MediaTokens:
    """A model's placeholder tokens: (start, pad, end) per modality."""

    audio: tuple[str, str, str]
    image: tuple[str, str, str]

    def placeholder(self, modality: str) -> str:
        """The string a chat template renders for one item of `modality`."""
        return "".join(getattr(self, modality))

    def placeholders(self) -> dict[str, str]:
        return {m: self.placeholder(m) for m in MODALITIES}


def thinker_modalities(config: Any) -> frozenset[str]:
    """What an omni config's thinker accepts besides text: audio if it has an audio
    encoder and an audio token, images if it has a vision encoder and an image token."""
    thinker = getattr(config, "thinker_config", None)
    if thinker is None:
        return frozenset()
    found = set()
    if getattr(thinker, "audio_config", None) is not None and thinker.audio_token_id is not None:
        found.add("audio")
    if getattr(thinker, "vision_config", None) is not None and thinker.image_token_id is not None:
        found.add("image")
    return frozenset(found)


def check_modalities(supported: Iterable[str], modalities: Iterable[str]) -> None:
    """ValueError naming the first of `modalities` not in `supported`."""
    supported = frozenset(supported)
    for modality in modalities:
        if modality not in supported:
            accepted = ", ".join(sorted(supported)) or "none"
            raise ValueError(
                f"{modality}: this model does not accept {modality} input "
                f"(accepted besides text: {accepted})"
            )
