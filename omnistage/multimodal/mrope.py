"""The 3-D rotary (mrope) positions of a prompt of text, audio and image tokens, as the
Qwen omni models' `get_rope_index` computes them (`mrope_positions`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def mrope_positions(
    input_ids: Sequence[int] | torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    *,
    image_token_id: int,
    spatial_merge_size: int,
    position_id_per_seconds: float,
) -> tuple[torch.Tensor, int]:
    """`([3, L] int64 positions, rope_delta)` as `get_rope_index` computes them for one
    unpadded sequence of text, audio and image tokens (no videos), in Qwen3-Omni and in
    Qwen2.5-Omni alike.

    Text and audio tokens (and the start/end markers) take the next position in all three
    rows. The `t*h*w / m**2` tokens of image `k` (its grid `image_grid_thw[k]`) take
    `(next + t_i * position_id_per_seconds, next + h_i, next + w_i)` over its merged grid
    in (t, h, w) order; the token after it continues at the block's maximum + 1.
    `rope_delta = max + 1 - L` (0 without images).
    """
    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(-1)
    length = ids.numel()
    if image_grid_thw is None or len(image_grid_thw) == 0:
        return torch.arange(length).expand(3, length).clone(), 0
    grids = torch.as_tensor(image_grid_thw, dtype=torch.long).reshape(-1, 3).tolist()
    positions = torch.empty(3, length, dtype=torch.long)
    is_image = (ids == image_token_id).tolist()
    nxt, i, image = 0, 0, 0
    while i < length:
        if not is_image[i]:
            positions[:, i] = nxt
            nxt += 1
            i += 1
            continue
        if image >= len(grids):
            raise ValueError("prompt: more image tokens than image grids")
        t, h, w = grids[image]
        gh, gw = h // spatial_merge_size, w // spatial_merge_size
        n = t * gh * gw
        if i + n > length or not all(is_image[i : i + n]):
            raise ValueError(f"prompt: image {image} needs {n} consecutive image tokens")
        t_index = torch.arange(t, dtype=torch.float64) * float(position_id_per_seconds)
        if not torch.equal(t_index, t_index.round()):
            raise ValueError("position_id_per_seconds: gives non-integer temporal positions")
        block = torch.stack(
            [
                t_index.long().view(-1, 1, 1).expand(t, gh, gw),
                torch.arange(gh).view(1, -1, 1).expand(t, gh, gw),
                torch.arange(gw).view(1, 1, -1).expand(t, gh, gw),
            ]
        ).reshape(3, n)
        positions[:, i : i + n] = block + nxt
        nxt = int(positions[:, i : i + n].max()) + 1
        i += n
        image += 1
    if image != len(grids):
        raise ValueError(f"prompt: {image} image blocks for {len(grids)} image grids")
    return positions, nxt - length
