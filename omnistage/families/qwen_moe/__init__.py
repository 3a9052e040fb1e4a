"""Qwen2-MoE and Qwen3-MoE: the Qwen decoders with sparse mixture-of-experts MLPs."""

from omnistage.models.family import Family

_MODEL = "omnistage.families.qwen_moe.model"

FAMILY = Family(
    name="qwen_moe",
    models={
        "Qwen2MoeForCausalLM": f"{_MODEL}:Qwen2MoeForCausalLM",
        "Qwen3MoeForCausalLM": f"{_MODEL}:Qwen3MoeForCausalLM",
    },
)
