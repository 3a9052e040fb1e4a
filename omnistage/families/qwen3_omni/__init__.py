"""Qwen3-Omni (MoE): audio, image and text in; text and speech out, as thinker -> talker
(with its code predictor) -> code2wav. Its tiny checkpoint is the built-in `demo-omni`."""

from omnistage.families.qwen3_omni.voices import DEFAULT_VOICE
from omnistage.models.family import Demo, Family, PartSpec, Voices

_PKG = "omnistage.families.qwen3_omni"
MODEL_TYPE = "qwen3_omni_moe"

FAMILY = Family(
    name="qwen3_omni",
    models={
        "OmnistageQwen3OmniThinker": f"{_PKG}.model:Qwen3OmniThinker",
        "OmnistageQwen3OmniTalker": f"{_PKG}.model:Qwen3OmniTalker",
    },
    parts={
        (MODEL_TYPE, "thinker"): PartSpec(
            ("thinker_config", "text_config"),
            "OmnistageQwen3OmniThinker",
            (("thinker.model.", "model."), ("thinker.lm_head.", "lm_head.")),
        ),
        (MODEL_TYPE, "talker"): PartSpec(
            ("talker_config", "text_config"),
            "OmnistageQwen3OmniTalker",
            (
                ("talker.model.codec_embedding.", "model.embed_tokens."),
                ("talker.model.", "model."),
                ("talker.codec_head.", "lm_head."),
                ("talker.code_predictor.", "code_predictor."),
            ),
            eos_token_id=("talker_config", "codec_eos_token_id"),
        ),
    },
    generation_parts={(MODEL_TYPE, "code2wav"): f"{_PKG}.code2wav:Qwen3OmniCode2Wav"},
    input_encoders={MODEL_TYPE: f"{_PKG}.input_encoder:Qwen3OmniInputEncoder"},
    edges={"qwen3_omni_thinker_to_talker": f"{_PKG}.edges:Qwen3OmniThinkerToTalker"},
    voices={"qwen3_omni_thinker_to_talker": Voices(f"{_PKG}.voices:speakers", DEFAULT_VOICE)},
    deploys_by_model_type={MODEL_TYPE: "qwen3-omni"},
    demos={
        "demo-omni": Demo(
            description=(
                "a tiny random-weight Qwen3-Omni-architecture checkpoint (thinker -> talker -> "
                "code2wav): the pipeline runs end to end, but its text and speech are noise. "
                "For real answers pass a downloaded Qwen3-Omni checkpoint directory as --model"
            ),
            maker=f"{_PKG}.tiny:make_tiny_qwen3_omni",
            deploy="demo-omni",
        )
    },
)
