"""`BagelMedia`: what the frontend asks of a Bagel checkpoint about media input.

Bagel takes images (editing, understanding). They are not encoded by an input encoder
in front of the entry stage, as the omni models' are: the understanding stage's prompter
turns them into context blocks (`image_prompt.py`), so this class only answers which
modalities the frontend lets through.
"""

from __future__ import annotations

from typing import Any


class BagelMedia:
    @classmethod
    def supported_modalities(cls, config: Any) -> frozenset[str]:
        return frozenset({"image"})

    @classmethod
    def from_checkpoint(cls, path: Any, dtype: Any = None, **kwargs: Any) -> BagelMedia:
        raise ValueError(f"{path}: Bagel's images are encoded by its understanding stage")
