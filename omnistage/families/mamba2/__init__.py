"""Mamba2: a state-space decoder (no KV cache; one recurrent state per request)."""

from omnistage.models.family import Family

FAMILY = Family(
    name="mamba2",
    models={"Mamba2ForCausalLM": "omnistage.families.mamba2.model:Mamba2ForCausalLM"},
)
