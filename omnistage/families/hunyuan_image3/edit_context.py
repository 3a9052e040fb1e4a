"""An edit's draw context: where the input images' blocks are in the context the thinker
handed over, and the conditional and unconditional contexts' input rows and layouts.

Each input image is the block the thinker's prompt holds (`input_encoder.py`):

    <boi> <img_size_B> <img_ratio_r> <timestep> <img> x h*w <joint_img_sep> <img> x P <eoi>

h x w is size r of the resolution group over the VAE scale, and the ViT run's patch grid is
the image's `mm.image_grid_thw` row (P, the padded run, ends at `<eoi>`). Its rows are the
encoders' and come with the hand-off (`edges.HunyuanImageHandOff`), not from `wte`.

The unconditional context is the reference's CFG companion (its tokenizer's `uncond_p=1`
pass): every text token becomes `<cfg>`; the image sections (special tokens, the VAE and
ViT rows) are kept, so the unconditional branch still sees the input image.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omnistage.families.hunyuan_image3.denoise import ContextLayout
from omnistage.families.hunyuan_image3.image_input import ImageSection
from omnistage.families.hunyuan_image3.resolution import resolution_group
from omnistage.families.hunyuan_image3.tokens import HunyuanTokens


@dataclass(frozen=True)
class ImageBlock:
    vae: ImageSection
    vit: ImageSection
    end: int
    """Index of the block's `<eoi>`."""

    @property
    def span(self) -> tuple[int, int]:
        """The rows that see each other both ways: the VAE run, the separator, the ViT run."""
        return self.vae.start, self.end


def find_blocks(
    ids: list[int], grids: torch.Tensor, tokens: HunyuanTokens, base: int, scale: int
) -> list[ImageBlock]:
    """The input images' blocks in `ids` (a prompt), one per `grids` row, in order;
    ValueError naming `image` when the ids do not hold them."""
    sizes = resolution_group(base)
    blocks: list[ImageBlock] = []
    at = 0
    for gh, gw in grids[:, 1:].tolist():
        boi = ids.index(tokens.boi, at) if tokens.boi in ids[at:] else -1
        ratio = tokens.ratios.index(ids[boi + 2]) if 0 <= boi < len(ids) - 2 else -1
        if boi < 0 or not 0 <= ratio < len(sizes):
            raise ValueError("image: the context does not hold the input image's block")
        height, width = sizes[ratio]
        h, w = height // scale, width // scale
        vae_start = boi + 4
        sep = vae_start + h * w
        if sep >= len(ids) or ids[sep] != tokens.joint_img_sep or tokens.eoi not in ids[sep:]:
            raise ValueError("image: the input image's block is not laid out as expected")
        end = ids.index(tokens.eoi, sep)
        blocks.append(ImageBlock(ImageSection(vae_start, h, w), ImageSection(sep + 1, gh, gw), end))
        at = end + 1
    return blocks


def edit_layouts(
    context: list[int],
    uncond: list[int],
    prompt_rows: torch.Tensor,
    blocks: list[ImageBlock],
    wte: torch.nn.Embedding,
) -> tuple[ContextLayout, ContextLayout]:
    """The conditional and unconditional contexts' layouts: `prompt_rows` (the thinker's
    input rows of its prompt) for the prompt's positions, `wte` for the rest; where the
    unconditional context has `<cfg>` in place of text, `wte(<cfg>)`."""
    with torch.no_grad():
        m = min(prompt_rows.shape[0], len(context))
        device = wte.weight.device
        head = prompt_rows[:m].to(device=device, dtype=wte.weight.dtype)
        rows = wte(torch.tensor(context, dtype=torch.int64, device=device))
        rows[:m] = head
        uncond_rows = wte(torch.tensor(uncond, dtype=torch.int64, device=device))
        kept = torch.tensor(context[:m], device=device) == torch.tensor(uncond[:m], device=device)
        uncond_rows[:m][kept] = head[kept]
    sections = tuple(s for b in blocks for s in (b.vae, b.vit))
    spans = tuple(b.span for b in blocks)
    return ContextLayout(rows, sections, spans), ContextLayout(uncond_rows, sections, spans)
