"""The image sizes HunyuanImage-3 draws and conditions on: its resolution group, one size
per `<img_ratio_i>`.

As the Instruct reference's `vae_reso_group` (`image_processor.py`: a
`ResolutionGroup(base_size, align=16, extra_resolutions=...)` from
`tokenization_hunyuan_image_3.py`, step base/16): from base x base, heights grow by the
step while widths shrink (down to base/2, up to 2 base), and the other way round, each
size rounded down to the alignment; sorted by height / width; then the extra sizes
1024x768, 1280x720, 768x1024, 720x1280 (height x width, absolute pixels) are appended in
that order, each unless a size of the group already has its ratio. Ratio token `i` names
size `i`; the nearest ratio (first on ties) picks an input image's size.

The reference cannot build this group when the step is below the alignment (`assert
align <= step`: base < 256), so it takes no input image there; omnistage still draws
at such tiny bases (the unaligned group, no extras) and refuses their input images
(`check_image_base`).
"""

from __future__ import annotations

ALIGN = 16
"""The reference's `ResolutionGroupConfig.align`: the VAE's 16x downsampling (x patch 1)."""
EXTRA_SIZES = ((1024, 768), (1280, 720), (768, 1024), (720, 1280))
"""(height, width) of the reference's `extra_resolutions`, in its order."""


def takes_images(base: int) -> bool:
    """Whether the reference can lay out input images at this base size (step >= align)."""
    return base // 16 >= ALIGN


def check_image_base(base: int) -> None:
    """ValueError naming `image` when a checkpoint of this base size cannot take one."""
    if not takes_images(base):
        raise ValueError(
            f"image: this checkpoint (image_base_size {base}) takes no input image: its "
            f"resolution group's step {base // 16} is below the VAE's {ALIGN}-pixel alignment "
            f"(the reference refuses such a group); use image_base_size >= {16 * ALIGN}"
        )


def resolution_group(base: int) -> list[tuple[int, int]]:
    """(height, width) of every ratio index, for `image_base_size` `base`."""
    step, low, high = base // 16, base // 2, base * 2
    align = ALIGN if takes_images(base) else 1
    sizes = [(base, base)]
    h = w = base
    while not (h >= high and w <= low):
        h, w = min(h + step, high), max(w - step, low)
        sizes.append((h // align * align, w // align * align))
    h = w = base
    while not (h <= low and w >= high):
        h, w = max(h - step, low), min(w + step, high)
        sizes.append((h // align * align, w // align * align))
    sizes.sort(key=lambda s: s[0] / s[1])
    if align == 1:
        return sizes
    ratios = {h / w for h, w in sizes}
    return sizes + [(h, w) for h, w in EXTRA_SIZES if h / w not in ratios]


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
