"""Ming-flash-omni-2.0 (inclusionAI Ming, `BailingMM2NativeForConditionalGeneration`): text,
images and audio in (`input_encoder.py`); text and speech out, as thinker (a
Bailing-MoE-V2 decoder) -> talker (a Qwen2 LM writing continuous latent patches:
`talker.py`) -> audio VAE decoder (`audio_vae.py`).
Its tiny checkpoint is the built-in `demo-ming-flash-omni`; `demo-ming-flash-omni-tts` serves
it by its talker alone (text to speech, `speech_prompt.py`; docs/ming_flash_omni.md)."""

from omnistage.models.family import Demo, Family, PartSpec

_PKG = "omnistage.families.ming_flash_omni"
MODEL_TYPE = "bailingmm_moe_v2_lite"
TALKER_RENAMES = (
    ("talker.model.model.", "model."),
    ("talker.model.lm_head.", "lm_head."),
    *((f"talker.{p}", p) for p in ("stop_head.", "spk_head.", "flowloss.", "linear_proj_audio.")),
)
"""The talker's weights (`talker.` + the reference's names) -> the names `MingFlashTalker`
loads."""
TALKER = PartSpec(
    ("talker_config",),
    "OmnistageMingFlashTalker",
    TALKER_RENAMES,
    eos_token_id=("talker_config", "eos_token_id"),
)
"""The talker, served as `talker` (fed the thinker's reply by a prompt edge) and as
`tts_talker` (the entry of the `-tts` deploys: it renders its own prompt from the request,
so its prompter is declared for that part alone and never takes over the edge's prompt)."""

FAMILY = Family(
    name="ming_flash_omni",
    models={
        "OmnistageMingFlashThinker": f"{_PKG}.thinker:BailingMoeV2ForCausalLM",
        "OmnistageMingFlashTalker": f"{_PKG}.talker:MingFlashTalker",
    },
    parts={
        (MODEL_TYPE, "thinker"): PartSpec(
            ("llm_config",),
            "OmnistageMingFlashThinker",
            (("model.model.", "model."), ("model.lm_head.", "lm_head.")),
        ),
        (MODEL_TYPE, "talker"): TALKER,
        (MODEL_TYPE, "tts_talker"): TALKER,
    },
    edges={
        "ming_flash_omni_thinker_to_talker": f"{_PKG}.edges:MingFlashThinkerToTalker",
        "ming_flash_omni_talker_to_audio_vae": f"{_PKG}.edges:MingFlashTalkerToAudioVAE",
    },
    generation_parts={(MODEL_TYPE, "audio_vae"): f"{_PKG}.audio_vae:MingFlashAudioVAE"},
    configs={
        MODEL_TYPE: f"{_PKG}.config:BailingMM2Config",
        "bailing_moe_v2": f"{_PKG}.config:BailingMoeV2Config",
        "ming_flash_talker": f"{_PKG}.talker_config:MingFlashTalkerConfig",
    },
    stage_prompters={(MODEL_TYPE, "tts_talker"): f"{_PKG}.speech_prompt:MingFlashSpeechPrompter"},
    deploys_by_model_type={MODEL_TYPE: "ming-flash-omni"},
    input_encoders={MODEL_TYPE: f"{_PKG}.input_encoder:MingFlashInputEncoder"},
    demos={
        "demo-ming-flash-omni": Demo(
            description=(
                "a tiny random-weight Ming-flash-omni-2.0-architecture checkpoint (Bailing-MoE-V2 "
                "thinker -> latent talker -> audio VAE): it runs end to end, but its text and "
                "speech are noise"
            ),
            maker=f"{_PKG}.tiny:make_tiny_ming_flash_omni",
            deploy="demo-ming-flash-omni",
            version=4,  # v2: talker, audio VAE; v3: the ViT's weights; v4: the audio encoder's
        ),
        "demo-ming-flash-omni-tts": Demo(
            description=(
                "demo-ming-flash-omni's tiny checkpoint served by its talker alone (talker -> "
                "audio VAE: text to speech on /v1/audio/speech); its speech is noise"
            ),
            maker=f"{_PKG}.tiny:make_tiny_ming_flash_omni",
            deploy="demo-ming-flash-omni-tts",
            version=4,
        ),
    },
)
