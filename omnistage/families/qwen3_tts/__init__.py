"""Qwen3-TTS (12 Hz): text in, speech out, as talker (with its code predictor) -> code2wav.
The talker renders its own prompt from the text, the voice (a named speaker, a voice
described in words, or a cloned one) and the language; its tiny checkpoint is the
built-in `demo-qwen3-tts`."""

from omnistage.models.family import Demo, Family, PartSpec, Voices

_PKG = "omnistage.families.qwen3_tts"
MODEL_TYPE = "qwen3_tts"

FAMILY = Family(
    name="qwen3_tts",
    models={"OmnistageQwen3TTSTalker": f"{_PKG}.model:Qwen3TTSTalker"},
    parts={
        (MODEL_TYPE, "talker"): PartSpec(
            ("talker_config",),
            "OmnistageQwen3TTSTalker",
            (
                ("talker.model.codec_embedding.", "model.embed_tokens."),
                ("talker.model.", "model."),
                ("talker.codec_head.", "lm_head."),
                ("talker.code_predictor.", "code_predictor."),
            ),
            eos_token_id=("talker_config", "codec_eos_token_id"),
        ),
    },
    generation_parts={(MODEL_TYPE, "code2wav"): f"{_PKG}.code2wav:Qwen3TTSCode2Wav"},
    configs={MODEL_TYPE: f"{_PKG}.config:Qwen3TTSConfig"},
    stage_prompters={MODEL_TYPE: f"{_PKG}.prompt:Qwen3TTSPrompter"},
    voices={MODEL_TYPE: Voices(f"{_PKG}.voices:speakers", None)},
    deploys_by_model_type={MODEL_TYPE: "qwen3-tts"},
    demos={
        "demo-qwen3-tts": Demo(
            description=(
                "a tiny random-weight Qwen3-TTS (12 Hz, CustomVoice) checkpoint (talker -> "
                "code2wav): the pipeline runs end to end, but its speech is noise. For real "
                "speech pass a downloaded Qwen3-TTS checkpoint directory as --model"
            ),
            maker=f"{_PKG}.tiny:make_tiny_qwen3_tts",
            deploy="demo-qwen3-tts",
        )
    },
)
