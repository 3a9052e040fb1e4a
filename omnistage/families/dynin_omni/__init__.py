"""Dynin-Omni (snu-aidas/Dynin-Omni): a LLaDA masked-diffusion model that writes text (its
own final output), image codes or speech units, and the decoders after it, as three
stages with two hops of one data plane: token2text -> token2image (MAGVITv2) ->
token2audio (EMOVA's unit-to-speech decoder; its style conditions are the voices)."""

from omnistage.models.family import Demo, Family, Voices

_PKG = "omnistage.families.dynin_omni"

FAMILY = Family(
    name="dynin_omni",
    configs={"dynin_omni": f"{_PKG}.config:DyninOmniHFConfig"},
    generation_parts={
        ("dynin_omni", "token2text"): f"{_PKG}.token2text:DyninToken2Text",
        ("dynin_omni", "token2image"): f"{_PKG}.token2image:DyninToken2Image",
        ("dynin_omni", "token2audio"): f"{_PKG}.token2audio:DyninToken2Audio",
    },
    edges={
        "dynin_token2image": f"{_PKG}.edges:DyninTextToImage",
        "dynin_token2audio": f"{_PKG}.edges:DyninImageToAudio",
    },
    deploys_by_model_type={"dynin_omni": "dynin-omni"},
    entry_media={"dynin_omni": ("image", "audio")},  # token2text encodes them (MAGVITv2, S2U)
    voices={  # emova_u2s.DEFAULT_STYLE, Dynin's t2s condition
        "dynin_token2audio": Voices(
            f"{_PKG}.token2audio:styles",
            "gender-female_emotion-neutral_speed-normal_pitch-normal",
            clones_uploads=False,
        )
    },
    demos={
        "demo-dynin-omni": Demo(
            description=(
                "a tiny random-weight Dynin-Omni (LLaDA masked diffusion, MAGVITv2 image "
                "encoder and decoder, EMOVA speech-to-unit encoder and unit-to-speech "
                "decoder): token2text -> token2image -> "
                "token2audio with the prompt metadata on both hops; its images and speech are "
                "noise. For real output pass a downloaded Dynin-Omni folder as --model"
            ),
            maker=f"{_PKG}.tiny:make_tiny_dynin_omni",
            deploy="dynin-omni",
            version=3,  # v3: EMOVA S2U (speech input); v2: chat template, MAGVITv2 encoder
        )
    },
)
