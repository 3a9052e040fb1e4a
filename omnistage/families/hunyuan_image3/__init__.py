"""HunyuanImage-3: one autoregressive MoE model that thinks, writes a recaption and the
image's aspect ratio (its own sampler forces the sections), then draws the image with
its own diffusion head and VAE."""

from omnistage.models.family import Demo, Family

_PKG = "omnistage.families.hunyuan_image3"

FAMILY = Family(
    name="hunyuan_image3",
    models={"HunyuanImage3ForCausalMM": f"{_PKG}.model:HunyuanImage3ForCausalMM"},
    configs={"hunyuan_image_3_moe": f"{_PKG}.config:HunyuanImage3Config"},
    input_encoders={"hunyuan_image_3_moe": f"{_PKG}.input_encoder:HunyuanImage3InputEncoder"},
    diffusion_pipelines={
        "OmnistageHunyuanImage3Pipeline": f"{_PKG}.pipeline:HunyuanImage3Pipeline"
    },
    edges={"hunyuan_image_context": f"{_PKG}.edges:HunyuanImageContext"},
    deploys_by_pipeline_class={"OmnistageHunyuanImage3Pipeline": "hunyuan-image3"},
    demos={
        "demo-hunyuan-image3": Demo(
            description=(
                "a tiny random-weight HunyuanImage-3 (MoE decoder that thinks, recaptions and "
                "picks the aspect ratio with its own sampler, then denoises the image with its "
                "image head and VAE; it also reads images: image-to-text, edits): every part runs, its "
                "thoughts are random bytes and its pictures noise"
            ),
            maker=f"{_PKG}.tiny:make_tiny_hunyuan_image3",
            deploy="demo-hunyuan-image3",
            version=2,
        )
    },
)
