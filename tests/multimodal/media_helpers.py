"""What the multimodal tests share: seeded test media, chat turns, and the reference
thinker's input embeddings (as transformers' forward builds them)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

RATE = 16000


def random_audio(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.1 * rng.standard_normal(int(seconds * RATE))).astype(np.float32)


def random_image(height: int, width: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def user_turn(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


def hf_thinker_embeds(thinker, ref) -> tuple[torch.Tensor, dict]:
    """The thinker's `inputs_embeds` after the scatter, as its forward builds them, and
    its audio / image masks (and deepstack features, for models that have them)."""
    ids = ref["input_ids"]
    extra = {}
    with torch.no_grad():
        embeds = thinker.get_input_embeddings()(ids)
        if "input_features" in ref:
            audio = thinker.get_audio_features(
                ref["input_features"],
                feature_attention_mask=ref["feature_attention_mask"],
                return_dict=True,
            ).last_hidden_state
            _, _, audio_mask = thinker.model.get_placeholder_mask(ids, inputs_embeds=embeds)
            embeds = embeds.masked_scatter(audio_mask, audio.to(embeds.dtype))
            extra["audio_mask"] = audio_mask[0, :, 0]
        if "pixel_values" in ref:
            vision = thinker.get_image_features(
                ref["pixel_values"], ref["image_grid_thw"], return_dict=True
            )
            image = torch.cat(vision.pooler_output)
            image_mask, _, _ = thinker.model.get_placeholder_mask(
                ids, inputs_embeds=embeds, image_features=image
            )
            embeds = embeds.masked_scatter(image_mask, image.to(embeds.dtype))
            extra["image_mask"] = image_mask[0, :, 0]
            deepstack = getattr(vision, "deepstack_features", None)
            if deepstack is not None:
                extra["deepstack"] = [torch.cat(f) for f in deepstack]
    return embeds[0], extra
