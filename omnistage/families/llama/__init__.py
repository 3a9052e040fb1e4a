"""Llama-architecture decoders: Llama, Mistral, Qwen2 and Qwen3 (dense, plain RoPE)."""

from omnistage.models.family import Family

_MODEL = "omnistage.families.llama.model"

FAMILY = Family(
    name="llama",
    models={
        "LlamaForCausalLM": f"{_MODEL}:LlamaForCausalLM",
        "MistralForCausalLM": f"{_MODEL}:LlamaForCausalLM",
        "Qwen2ForCausalLM": f"{_MODEL}:Qwen2ForCausalLM",
        "Qwen3ForCausalLM": f"{_MODEL}:Qwen3ForCausalLM",
    },
)
