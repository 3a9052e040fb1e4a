"""Bagel (ByteDance-Seed/Bagel): a Qwen2 mixture of transformers whose understanding expert
reads the prompt and whose generation expert draws the image by flow matching over FLUX VAE
latents, each denoising step attending to the prompt's KV cache."""

from omnistage.models.family import Family

_PKG = "omnistage.families.bagel"

FAMILY = Family(name="bagel")
