"""Qwen2.5-Omni: audio, image and text in; text and speech out, as thinker -> talker ->
token2wav (a DiT to mel, then BigVGAN)."""

from omnistage.families.qwen25_omni.voices import DEFAULT_VOICE
from omnistage.models.family import Family, PartSpec, Voices

_PKG = "omnistage.families.qwen25_omni"
MODEL_TYPE = "qwen2_5_omni"

FAMILY = Family(
    name="qwen25_omni",
    models={
        "OmnistageQwen25OmniThinker": f"{_PKG}.model:Qwen25OmniThinker",
        "OmnistageQwen25OmniTalker": f"{_PKG}.model:Qwen25OmniTalker",
    },
    parts={
        (MODEL_TYPE, "thinker"): PartSpec(
            ("thinker_config", "text_config"),
            "OmnistageQwen25OmniThinker",
            (("thinker.model.", "model."), ("thinker.lm_head.", "lm_head.")),
        ),
        (MODEL_TYPE, "talker"): PartSpec(
            ("talker_config",),
            "OmnistageQwen25OmniTalker",
            (
                ("talker.thinker_to_talker_proj.", "model.thinker_to_talker_proj."),
                ("talker.model.", "model."),
                ("talker.codec_head.", "lm_head."),
            ),
            # transformers also ends at tts_codec_pad (generate's eos [8292, 8294]); see
            # model.py.
            eos_token_id=("talker_config", "tts_codec_end_token_id"),
        ),
    },
    generation_parts={(MODEL_TYPE, "token2wav"): f"{_PKG}.token2wav:Qwen25OmniToken2Wav"},
    input_encoders={MODEL_TYPE: f"{_PKG}.input_encoder:Qwen25OmniInputEncoder"},
    edges={"qwen25_omni_thinker_to_talker": f"{_PKG}.edges:Qwen25OmniThinkerToTalker"},
    voices={"qwen25_omni_thinker_to_talker": Voices(f"{_PKG}.voices:speakers", DEFAULT_VOICE)},
    deploys_by_model_type={MODEL_TYPE: "qwen25-omni"},
)
