"""The special tokens HunyuanImage-3's own sampler reads, by id, from its tokenizer.json.

The ids come from the checkpoint's tokenizer (its `added_tokens`), as the reference
looks them up with `convert_tokens_to_ids`; reading the JSON keeps the model free
of a tokenizer object. Sections of an answer: `<think>…</think>`, then
`<recaption>…</recaption>`, then `<answer><boi><img_size_{base}><img_ratio_{i}>`
and the end: the aspect ratio of the image to draw.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

NUM_RATIOS = 33
"""`<img_ratio_0>` … `<img_ratio_32>`: the reference's resolution group."""
EXTRA_RATIOS = range(33, 37)
"""`<img_ratio_33>` … `<img_ratio_36>`: also allowed after the size token."""


@dataclass(frozen=True)
class HunyuanTokens:
    end_of_think: int
    recaption: int
    end_of_recaption: int
    answer: int
    boi: int
    eoi: int
    img: int
    """`<img>`: each token of an image in the context."""
    joint_img_sep: int
    """`<joint_img_sep>`: between an input image's VAE and ViT tokens."""
    size: int
    """`<img_size_{image_base_size}>`."""
    ratios: tuple[int, ...]
    """Every ratio token allowed after the size token (the 33, then the extra ones)."""
    eos: int
    cfg: int
    """`<cfg>`: what the unconditional context has in place of each text token."""
    specials: frozenset[int]
    """Every added (special) token id; the others are text."""

    @classmethod
    def from_checkpoint(cls, path: str | Path, image_base_size: int, eos: int) -> HunyuanTokens:
        """Ids from `path/tokenizer.json`; ValueError naming a token it lacks."""
        file = Path(path) / "tokenizer.json"
        if not file.is_file():
            raise ValueError(f"{path}: HunyuanImage-3 needs its tokenizer.json next to config.json")
        added = {t["content"]: t["id"] for t in json.loads(file.read_text())["added_tokens"]}

        def id_of(token: str) -> int:
            if token not in added:
                raise ValueError(f"{file}: special token {token!r} is missing")
            return int(added[token])

        ratios = [f"<img_ratio_{i}>" for i in (*range(NUM_RATIOS), *EXTRA_RATIOS)]
        return cls(
            end_of_think=id_of("</think>"),
            recaption=id_of("<recaption>"),
            end_of_recaption=id_of("</recaption>"),
            answer=id_of("<answer>"),
            boi=id_of("<boi>"),
            eoi=id_of("<eoi>"),
            img=id_of("<img>"),
            joint_img_sep=id_of("<joint_img_sep>"),
            size=id_of(f"<img_size_{image_base_size}>"),
            ratios=tuple(id_of(t) for t in ratios),
            eos=eos,
            cfg=id_of("<cfg>"),
            specials=frozenset(int(i) for i in added.values()),
        )


def special_token_names(image_base_size: int) -> list[str]:
    """Every special token `HunyuanTokens` reads, in a stable order (for tiny tokenizers)."""
    ratios = [f"<img_ratio_{i}>" for i in (*range(NUM_RATIOS), *EXTRA_RATIOS)]
    return [
        "<think>",
        "</think>",
        "<recaption>",
        "</recaption>",
        "<answer>",
        "</answer>",
        "<boi>",
        "<eoi>",
        "<img>",
        "<timestep>",
        f"<img_size_{image_base_size}>",
        *ratios,
        "<cfg>",
        "<joint_img_sep>",
    ]


def first_eos(config: object) -> int:
    """The config's end id (the first, where it lists several)."""
    eos = getattr(config, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, (list, tuple)) else eos
    if eos is None:
        raise ValueError("eos_token_id: HunyuanImage-3's sampler needs the end token's id")
    return int(eos)
