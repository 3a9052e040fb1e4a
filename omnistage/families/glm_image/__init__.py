"""GLM-Image: an autoregressive prior (GLM decoder writing image tokens, 3-D positions) whose
tokens condition a DiT decoder (glyph encoder, transformer, VAE)."""

from omnistage.models.family import Family

_PKG = "omnistage.families.glm_image"

FAMILY = Family(
    name="glm_image",
    models={"GlmImageForConditionalGeneration": f"{_PKG}.prior:GlmImagePrior"},
    stage_prompters={"glm_image": f"{_PKG}.prior_prompt:GlmImagePriorPrompter"},
    diffusion_pipelines={"GlmImagePipeline": f"{_PKG}.decoder:GlmImageDecoder"},
    deploys_by_pipeline_class={"GlmImagePipeline": "glm-image"},
)
