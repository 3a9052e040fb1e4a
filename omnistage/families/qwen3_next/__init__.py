"""Qwen3-Next and Qwen3.5: hybrid decoders of gated delta-net and full-attention layers."""

from omnistage.models.family import Family

_MODEL = "omnistage.families.qwen3_next.model"

FAMILY = Family(
    name="qwen3_next",
    models={
        "Qwen3NextForCausalLM": f"{_MODEL}:Qwen3NextForCausalLM",
        "Qwen3_5ForCausalLM": f"{_MODEL}:Qwen3_5ForCausalLM",
    },
)
