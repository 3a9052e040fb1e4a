"""`image_prompt`: a Bagel request with input images as the understanding stage's prompt.

The reference (`InterleaveInferencer.interleave_inference`, images before the text) puts
each image into the context as blocks: for an edit its VAE block then its ViT block, for
understanding the ViT block alone. This stage cannot compute those blocks (see
`understanding.py`), so `image_prompt` prefills them here with the MoT
(`text_to_image.BagelImageModel`, loaded on first use in the stage's process) and lays the
request out as:

```
ids        <|vision_start|> pad … pad <|vision_end|>  … <|im_start|> text <|im_end|> [<|im_start|>]
RoPE       0                0 … 0     0               …  b           b+1 …  b+n+1      b+n+2
KV         given (deepstack rows)                        computed by the stage
```

with `b` the number of blocks; an understanding request ends with `<|im_start|>`, the
token the reference feeds before its answer, so the stage's first sampled token is the
answer's first. Generated tokens continue the RoPE positions (`rope_delta`). The
posterior of an edited image's VAE latents is taken at its mean here (the reference
samples it with the global RNG; its parity test passes that sample explicitly).
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.families.bagel.context import KVContext
from omnistage.families.bagel.image_input import vae_block, vit_block

PAD = 0
"""The id at image positions (never embedded for real: their KV is given)."""


def image_blocks(model: Any, images: list[Any], understanding: bool) -> tuple[KVContext, list[int]]:
    """The context of `images` (blocks in the reference's order) and each block's length."""
    if model.vision is None:
        raise ValueError(f"images: {model.path} has no vision encoder")
    lm, markers = model.language_model, (model.start_of_image, model.end_of_image)
    context, lengths = lm.empty_context(), []
    for image in images:
        image = model.vae_bounds.resize(image)
        if not understanding:
            pixels = model.vae_bounds.to_pixels(image)
            grown = vae_block(model.generator, model.vae, pixels, markers, context, None)
            lengths.append(grown.length - context.length)
            context = grown
        pixels = model.vit_bounds.to_pixels(image)
        grown = vit_block(model.generator, model.vision, pixels, markers, context)
        lengths.append(grown.length - context.length)
        context = grown
    return context, lengths


def image_prompt(
    model: Any, images: list[Any], text_ids: list[int], understanding: bool
) -> tuple[list[int], MultimodalDecoderInputs]:
    """(prompt ids, decoder inputs) of `images` then `text_ids` (`<|im_start|> … <|im_end|>`),
    plus the answer's start token for `understanding`."""
    context, lengths = image_blocks(model, images, understanding)
    ids: list[int] = []
    for n in lengths:
        ids += [model.start_of_image, *[PAD] * (n - 2), model.end_of_image]
    tail = [*text_ids, model.bos] if understanding else list(text_ids)
    prefix = len(ids)
    ids += tail
    rope = torch.cat(
        [
            torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)),
            torch.arange(len(lengths), len(lengths) + len(tail)),
        ]
    )
    lm = model.language_model
    hidden = lm.config.hidden_size
    width = 2 * lm.num_kv_heads * lm.head_dim
    if width > hidden:
        raise ValueError(
            f"images: a layer's KV row ({width} values) is wider than the hidden size "
            f"({hidden}); the stage's per-layer rows cannot carry it"
        )
    rows = context.to_rows().view(prefix, lm.num_layers, width).transpose(0, 1)
    feats = torch.zeros(lm.num_layers, prefix, hidden, dtype=rows.dtype)
    feats[:, :, :width] = rows
    mask = torch.zeros(len(ids), dtype=torch.bool)
    mask[:prefix] = True
    inputs = MultimodalDecoderInputs(
        mrope_positions=rope.expand(3, -1).clone(),
        rope_delta=int(rope[-1]) + 1 - len(ids),
        visual_pos_mask=mask,
        deepstack_embeds=feats,
    )
    return ids, inputs
