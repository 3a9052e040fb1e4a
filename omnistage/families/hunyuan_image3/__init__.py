"""HunyuanImage-3: one autoregressive MoE model that thinks, writes a recaption and the
image's aspect ratio (its own sampler forces the sections), then draws the image with
its own diffusion head."""

from omnistage.models.family import Family

_PKG = "omnistage.families.hunyuan_image3"

FAMILY = Family(
    name="hunyuan_image3",
    models={"HunyuanImage3ForCausalMM": f"{_PKG}.model:HunyuanImage3ForCausalMM"},
    configs={"hunyuan_image_3_moe": f"{_PKG}.config:HunyuanImage3Config"},
)
