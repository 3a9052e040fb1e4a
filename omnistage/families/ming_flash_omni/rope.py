"""Ming-flash-omni-2.0's 3-D rotary positions (`rope_scaling.type: video_rope`).

Read from vLLM-Omni's port of the reference `modeling_bailing_moe_v2.py`
(`MingVideoRopeMRotaryEmbedding`, `get_rope_index`; the reference file itself was not in
the code index), which its multimodal runtime (`get_mrope_input_positions`) agrees with:

- frequencies: of the `rotary_dim / 2` rotary frequencies, the first
  `mrope_section[1] + mrope_section[2]` alternate H (even index) and W (odd index), the
  rest take T (`mrope_section` from `rope_scaling`, default [8, 12, 12]);
- positions: text runs count on from the previous run's largest position + 1 in all
  three rows; an image's `<imagePatch>` run of grid (t, h / merge, w / merge) takes
  (t, row, column) + s, where s is the first patch's text position (the text before it
  counted), in t-major, row-major order; the text after it starts at their largest + 1;
- a generated token at output position j takes `prompt length + j + delta` in every row,
  delta = largest prompt position + 1 - prompt length.

A text prompt's three rows are equal, which is plain partial RoPE (the thinker's 1-D path).
"""

from __future__ import annotations

from typing import Any

import torch

DEFAULT_SECTION = (8, 12, 12)


def mrope_section(config: Any) -> list[int]:
    """The thinker's (T, H, W) frequency counts (ValueError when they do not split the
    rotary frequencies)."""
    rope = config.mm_rope_scaling or {}
    section = [int(n) for n in rope.get("mrope_section", DEFAULT_SECTION)]
    if len(section) != 3 or sum(section) != config.rotary_dim // 2:
        raise ValueError(
            f"llm_config.rope_scaling.mrope_section: {section} must be 3 counts summing to "
            f"rotary_dim / 2 = {config.rotary_dim // 2}"
        )
    return section


def video_rope_rows(config: Any) -> torch.Tensor:
    """[rotary_dim / 2] int64: the position row (0 T, 1 H, 2 W) of each rotary frequency."""
    t, h, w = mrope_section(config)
    rows = torch.zeros(t + h + w, dtype=torch.int64)
    rows[0 : h + w : 2] = 1
    rows[1 : h + w : 2] = 2
    return rows


def image_positions(
    ids: list[int], patch_id: int, grids: torch.Tensor, merge: int
) -> tuple[torch.Tensor, int]:
    """([3, len(ids)] int64 positions, delta) of a prompt whose `<imagePatch>` runs are the
    images of `grids` ([n, 3] (t, h, w) patch grids), in order."""
    parts: list[torch.Tensor] = []
    start = nxt = 0
    for t, h, w in grids.tolist():
        gh, gw = h // merge, w // merge
        first = ids.index(patch_id, start)
        text = first - start
        parts.append(torch.arange(text).expand(3, -1) + nxt)
        s = nxt + text
        tt = torch.arange(t).repeat_interleave(gh * gw)
        hh = torch.arange(gh).repeat_interleave(gw).repeat(t)
        ww = torch.arange(gw).repeat(t * gh)
        block = torch.stack([tt, hh, ww]) + s
        parts.append(block)
        nxt = int(block.max()) + 1
        start = first + t * gh * gw
    parts.append(torch.arange(len(ids) - start).expand(3, -1) + nxt)
    positions = torch.cat(parts, dim=1)
    return positions, int(positions.max()) + 1 - len(ids)
