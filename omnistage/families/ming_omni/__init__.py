"""Ming-Omni (inclusionAI Ming, `BailingMMNativeForConditionalGeneration`): text, images and audio in; text
and speech out, as thinker (Bailing-MoE) -> talker (Qwen2 over speech BPE ids) -> vocoder
(speech BPE -> S3 codes -> CosyVoice-1 flow + HiFT).
Its tiny checkpoint is the built-in `demo-ming-omni`; `demo-ming-omni-tts` serves it by its
talker alone (text to speech, `speech_prompt.py`)."""

from omnistage.models.family import Demo, Family, PartSpec, Voices

_PKG = "omnistage.families.ming_omni"
MODEL_TYPE = "bailingmm"
EDGE = "ming_omni_thinker_to_talker"
VOCODER_EDGE = "ming_omni_talker_to_vocoder"

FAMILY = Family(
    name="ming_omni",
    models={
        "BailingMoeForCausalLM": f"{_PKG}.thinker:BailingMoeForCausalLM",
        "OmnistageMingThinker": f"{_PKG}.thinker:MingThinker",
        "OmnistageMingTalker": f"{_PKG}.talker:MingTalker",
    },
    parts={
        (MODEL_TYPE, "thinker"): PartSpec(
            ("llm_config",),
            "OmnistageMingThinker",
            (("model.model.", "model."), ("model.lm_head.", "lm_head.")),
        ),
        (MODEL_TYPE, "bailing_talker"): PartSpec(
            ("talker_qwen2",),
            "OmnistageMingTalker",
            (("talker.model.model.", "model."), ("talker.model.lm_head.", "lm_head.")),
            eos_token_id=("talker_qwen2", "eos_token_id"),
        ),
    },
    generation_parts={(MODEL_TYPE, "vocoder"): f"{_PKG}.token2wav:MingToken2Wav"},
    configs={
        MODEL_TYPE: f"{_PKG}.config:BailingMMConfig",
        "bailing_moe": f"{_PKG}.config:BailingMoeConfig",
    },
    edges={
        EDGE: f"{_PKG}.edges:MingThinkerToTalker",
        VOCODER_EDGE: f"{_PKG}.edges:MingTalkerToVocoder",
    },
    stage_prompters={(MODEL_TYPE, "bailing_talker"): f"{_PKG}.speech_prompt:MingSpeechPrompter"},
    voices={
        EDGE: Voices(f"{_PKG}.prompt:speaker_names", "luna", clones_uploads=False),
        MODEL_TYPE: Voices(f"{_PKG}.prompt:speaker_names", "luna", clones_uploads=False),
    },
    input_encoders={MODEL_TYPE: f"{_PKG}.input_encoder:MingInputEncoder"},
    deploys_by_model_type={MODEL_TYPE: "ming-omni"},
    demos={
        "demo-ming-omni": Demo(
            description=(
                "a tiny random-weight Ming-Omni-architecture checkpoint (Bailing-MoE thinker "
                "-> talker -> flow + HiFT vocoder): the pipeline runs end to end, but its text "
                "and speech are noise"
            ),
            maker=f"{_PKG}.tiny:make_tiny_ming_omni",
            deploy="demo-ming-omni",
            version=4,  # v2: the vocoder files; v3: the image encoder; v4: the audio encoder
        ),
        "demo-ming-omni-tts": Demo(
            description=(
                "demo-ming-omni's tiny checkpoint served by its talker alone (talker -> "
                "vocoder: text to speech on /v1/audio/speech); its speech is noise"
            ),
            maker=f"{_PKG}.tiny:make_tiny_ming_omni",
            deploy="demo-ming-omni-tts",
            version=4,
        ),
    },
)
