"""CosyVoice3: text in, speech out, as LM (a Qwen2 decoder over speech tokens) ->
token2wav (a flow-matching DiT to mel, then the causal HiFT vocoder).

Checkpoints come in the reference's layout (`cosyvoice3.yaml`, `llm.pt`, `flow.pt`,
`hift.pt`, `CosyVoice-BlankEN/`, optional `spk2info.pt` voices), converted once into an
HF view (`layout.py`). The LM renders its own prompt from the text and a voice; its tiny
checkpoint is the built-in `demo-cosyvoice3`."""

from omnistage.models.family import Demo, Family, PartSpec, Voices

_PKG = "omnistage.families.cosyvoice3"
MODEL_TYPE = "cosyvoice3"

FAMILY = Family(
    name="cosyvoice3",
    models={"OmnistageCosyVoice3LM": f"{_PKG}.model:CosyVoice3LM"},
    parts={
        (MODEL_TYPE, "llm"): PartSpec(
            ("llm_config",),
            "OmnistageCosyVoice3LM",
            (("model.", "model."), ("lm_head.", "lm_head.")),
            eos_token_id=("eos_token_id_speech",),
        ),
    },
    generation_parts={(MODEL_TYPE, "token2wav"): f"{_PKG}.token2wav:CosyVoice3Token2Wav"},
    configs={MODEL_TYPE: f"{_PKG}.config:CosyVoice3Config"},
    stage_prompters={MODEL_TYPE: f"{_PKG}.prompt:CosyVoice3Prompter"},
    # Named voices come from spk2info.pt; uploads are cloned with the checkpoint's
    # speech tokenizer and CAM++ (clone.py).
    voices={MODEL_TYPE: Voices(f"{_PKG}.voices:speakers", None)},
    deploys_by_model_type={MODEL_TYPE: "cosyvoice3"},
    layouts={"cosyvoice3.yaml": f"{_PKG}.layout:convert"},
    demos={
        "demo-cosyvoice3": Demo(
            description=(
                "a tiny random-weight CosyVoice3 checkpoint (LM -> flow -> HiFT) with two "
                "voices: the pipeline runs end to end, but its speech is noise. For real "
                "speech pass a downloaded Fun-CosyVoice3 checkpoint folder as --model"
            ),
            maker=f"{_PKG}.tiny:make_tiny_cosyvoice3",
            deploy="demo-cosyvoice3",
            version=2,  # 2: the speech tokenizer and CAM++ ONNX files (cloning uploads)
        )
    },
)
