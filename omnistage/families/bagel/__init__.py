"""Bagel (ByteDance-Seed/Bagel): a Qwen2 mixture of transformers whose understanding expert
reads the prompt and whose generation expert draws the image by flow matching over FLUX VAE
latents, each denoising step attending to the prompt's KV cache.

Checkpoints come in Bagel's own layout (`llm_config.json`, `ema.safetensors`,
`ae.safetensors`, …), seen through a view (`layout.py`): an AR stage runs the
understanding expert on our engine and hands the prompt's KV rows to the draw stage."""

from omnistage.models.family import Demo, Family

_PKG = "omnistage.families.bagel"
PIPELINE = "OmnistageBagelPipeline"

FAMILY = Family(
    name="bagel",
    models={"OmnistageBagelUnderstanding": f"{_PKG}.understanding:BagelUnderstanding"},
    configs={"bagel_understanding": f"{_PKG}.understanding:BagelUnderstandingConfig"},
    stage_prompters={"bagel_understanding": f"{_PKG}.prompt:BagelPrompter"},
    input_encoders={"bagel_understanding": f"{_PKG}.media:BagelMedia"},
    diffusion_pipelines={PIPELINE: f"{_PKG}.draw:BagelDraw"},
    edges={"bagel_prompt_kv": f"{_PKG}.edges:BagelPromptKV"},
    deploys_by_pipeline_class={PIPELINE: "bagel"},
    deploys_by_model_type={"bagel_understanding": "bagel"},
    layouts={"llm_config.json": f"{_PKG}.layout:convert"},
    demos={
        "demo-bagel": Demo(
            description=(
                "a tiny random-weight Bagel (MoT understanding + generation experts, FLUX "
                "VAE): the prompt's KV cache goes from the understanding stage to the draw "
                "stage, but its pictures are noise. For real images pass a downloaded "
                "BAGEL-7B-MoT folder as --model"
            ),
            maker=f"{_PKG}.tiny:make_demo_bagel",
            deploy="bagel",
            version=2,
        )
    },
)
