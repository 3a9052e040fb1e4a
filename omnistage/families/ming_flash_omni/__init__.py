"""Ming-flash-omni-2.0 (inclusionAI Ming, `BailingMM2NativeForConditionalGeneration`): text
in, text out, by its thinker (a Bailing-MoE-V2 decoder). Of its talker only the latent
heads exist (`talker_heads.py`: the flow-matching head, the aggregator); its LM stage and
audio VAE are not built yet (docs/ming_flash_omni.md).
Its tiny checkpoint is the built-in `demo-ming-flash-omni`."""

from omnistage.models.family import Demo, Family, PartSpec

_PKG = "omnistage.families.ming_flash_omni"
MODEL_TYPE = "bailingmm_moe_v2_lite"

FAMILY = Family(
    name="ming_flash_omni",
    models={"OmnistageMingFlashThinker": f"{_PKG}.thinker:BailingMoeV2ForCausalLM"},
    parts={
        (MODEL_TYPE, "thinker"): PartSpec(
            ("llm_config",),
            "OmnistageMingFlashThinker",
            (("model.model.", "model."), ("model.lm_head.", "lm_head.")),
        ),
    },
    configs={
        MODEL_TYPE: f"{_PKG}.config:BailingMM2Config",
        "bailing_moe_v2": f"{_PKG}.config:BailingMoeV2Config",
    },
    deploys_by_model_type={MODEL_TYPE: "ming-flash-omni"},
    demos={
        "demo-ming-flash-omni": Demo(
            description=(
                "a tiny random-weight Ming-flash-omni-2.0-architecture checkpoint (its "
                "Bailing-MoE-V2 thinker only): the stage runs end to end, but its text is noise"
            ),
            maker=f"{_PKG}.tiny:make_tiny_ming_flash_omni",
            deploy="demo-ming-flash-omni",
        )
    },
)
