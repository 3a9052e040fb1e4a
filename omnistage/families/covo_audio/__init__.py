"""Covo-Audio (Tencent Covo-Audio-Chat): audio and text in; one fused thinker + talker LM
(Qwen2) writing text and speech codes in one sequence -> code2wav (a flow-matching DiT to latents, then
BigVGAN). The edge carries the LM's output ids; code2wav keeps the speech codes (the
per-family token filter, `code2wav.speech_codes`). Its tiny checkpoint is the built-in
`demo-covo-audio`."""

from omnistage.models.family import Demo, Family, PartSpec

_PKG = "omnistage.families.covo_audio"
MODEL_TYPE = "covo_audio"

FAMILY = Family(
    name="covo_audio",
    models={"OmnistageCovoAudioLM": f"{_PKG}.model:CovoAudioLM"},
    parts={
        (MODEL_TYPE, "fused_thinker_talker"): PartSpec(
            ("llm_config",),
            "OmnistageCovoAudioLM",
            (("llm.model.", "model."), ("llm.lm_head.", "lm_head.")),
        ),
    },
    generation_parts={(MODEL_TYPE, "code2wav"): f"{_PKG}.code2wav:CovoAudioCode2Wav"},
    configs={MODEL_TYPE: f"{_PKG}.config:CovoAudioConfig"},
    input_encoders={MODEL_TYPE: f"{_PKG}.audio_input:CovoAudioInputEncoder"},
    deploys_by_model_type={MODEL_TYPE: "covo-audio"},
    demos={
        "demo-covo-audio": Demo(
            description=(
                "a tiny random-weight Covo-Audio checkpoint (fused thinker+talker -> "
                "code2wav): the pipeline runs end to end, but its text and speech are noise. "
                "For real speech pass a downloaded Covo-Audio-Chat directory as --model"
            ),
            maker=f"{_PKG}.tiny:make_tiny_covo_audio",
            deploy="demo-covo-audio",
        )
    },
)
