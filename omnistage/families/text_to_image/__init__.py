"""Think -> recaption -> draw with a small text-conditioned DiT (T5 text encoder, PixArt
transformer, VAE): the built-in `demo-image` pipeline."""

from omnistage.models.family import Demo, Family

FAMILY = Family(
    name="text_to_image",
    diffusion_pipelines={
        "OmnistageTextToImagePipeline": "omnistage.families.text_to_image.text_dit:TextDiT"
    },
    deploys_by_pipeline_class={"OmnistageTextToImagePipeline": "demo-image"},
    demos={
        "demo-image": Demo(
            description=(
                "a tiny random-weight think -> recaption -> draw pipeline (llama thinker, T5 "
                "text encoder, PixArt DiT, VAE): every stage runs, but its thoughts are random "
                "bytes and its pictures noise. For real images pass a downloaded GLM-Image "
                "checkpoint directory as --model"
            ),
            maker="omnistage.families.text_to_image.tiny:make_tiny_image_pipeline",
            deploy="demo-image",
        )
    },
)
