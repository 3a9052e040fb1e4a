"""MiMo-Audio (XiaomiMiMo): one fused LM that writes text and 8-codebook speech codes in
one sequence (its local transformer writes each position's group of frames), then
code2wav, the MiMo-Audio tokenizer's decoder; audio in through its encoder
(`audio_input.py`). Its tiny checkpoint is the built-in `demo-mimo-audio`. Checkpoints
as published (`model_type: qwen2`, architectures `MiMoAudioModel`) are seen through a
view (`layout.py`)."""

from omnistage.models.family import Demo, Family, PartSpec

_PKG = "omnistage.families.mimo_audio"
MODEL_TYPE = "mimo_audio"

FAMILY = Family(
    name="mimo_audio",
    models={
        "MiMoAudioForCausalLM": f"{_PKG}.model:MiMoAudioForCausalLM",
        "MiMoAudioModel": f"{_PKG}.model:MiMoAudioForCausalLM",
    },
    parts={(MODEL_TYPE, "lm"): PartSpec((), "MiMoAudioForCausalLM", (("", ""),))},
    generation_parts={
        (MODEL_TYPE, "code2wav"): f"{_PKG}.code2wav:MiMoAudioCode2Wav",
        (MODEL_TYPE, "code2wav_stream"): f"{_PKG}.streaming:MiMoAudioStreamingCode2Wav",
    },
    configs={MODEL_TYPE: f"{_PKG}.config:MiMoAudioConfig"},
    input_encoders={MODEL_TYPE: f"{_PKG}.audio_input:MiMoAudioInputEncoder"},
    edges={"mimo_audio_codes": f"{_PKG}.edges:MiMoAudioCodes"},
    deploys_by_model_type={MODEL_TYPE: "mimo-audio"},
    architecture_layouts={"MiMoAudioModel": f"{_PKG}.layout:convert"},
    demos={
        "demo-mimo-audio": Demo(
            description=(
                "a tiny random-weight MiMo-Audio checkpoint (fused LM with its local "
                "transformer -> audio tokenizer decoder): text and speech codes in one "
                "sequence, end to end, but its speech is noise. For real speech pass a "
                "MiMo-Audio checkpoint directory as published (XiaomiMiMo/MiMo-Audio-Tokenizer "
                "in its audio_tokenizer/ or beside it as MiMo-Audio-Tokenizer/) "
                "as --model"
            ),
            maker=f"{_PKG}.tiny:make_demo_mimo_audio",
            deploy="demo-mimo-audio",
            version=3,
        )
    },
)
