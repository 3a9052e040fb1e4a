"""The image sizes HunyuanImage-3 draws: its resolution group, one size per `<img_ratio_i>`.

As the reference's `ResolutionGroup(base_size)` (`tokenizer_wrapper.py`, step base/16,
align 1): from base x base, heights grow by the step while widths shrink (down to
base/2, up to 2 base), and the other way round; sorted by height / width. Ratio token
`i` names size `i`.
"""

from __future__ import annotations


def resolution_group(base: int) -> list[tuple[int, int]]:
    """(height, width) of every ratio index, for `image_base_size` `base`."""
    step, low, high = base // 16, base // 2, base * 2
    sizes = [(base, base)]
    h = w = base
    while not (h >= high and w <= low):
        h, w = min(h + step, high), max(w - step, low)
        sizes.append((h, w))
    h = w = base
    while not (h <= low and w >= high):
        h, w = max(h - step, low), min(w + step, high)
        sizes.append((h, w))
    return sorted(sizes, key=lambda s: s[0] / s[1])


def ratio_index(base: int, height: int, width: int) -> int:
    """The ratio token index of an exact size of the group; ValueError naming the size."""
    sizes = resolution_group(base)
    if (height, width) not in sizes:
        shown = ", ".join(f"{h}x{w}" for h, w in sizes[:: max(1, len(sizes) // 8)])
        raise ValueError(
            f"height/width: {height}x{width} is not one of this model's sizes "
            f"(its resolution group for base {base}, e.g. {shown})"
        )
    return sizes.index((height, width))
