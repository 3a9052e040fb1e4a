"""A tiny random-weight Ming-flash-omni-2.0 checkpoint (`BailingMM2NativeForConditionalGeneration`
layout): the built-in `demo-ming-flash-omni` and what the tests build from.

The real layout at small sizes (`config.py` describes it): `config.json`
(`BailingMM2Config` with the real field names; the ViT of `tiny_vision.py`, the Whisper
encoder of `tiny_audio.py`; the talker of `tiny_talker.py`),
one safetensors file with the reference's thinker weight names
(`model.model.word_embeddings.weight`, `model.model.layers.N.attention.query_key_value.weight`,
`...attention.q_norm.weight`, `...attention.dense.weight`, `...mlp.gate.weight`,
`...mlp.gate.expert_bias`, `...mlp.image_gate.expert_bias`, `...mlp.experts.E.up_proj.weight`,
`...mlp.shared_experts.down_proj.weight`, `model.lm_head.weight`, …) and a byte-level
tokenizer (with a ChatML template, not Ming's, rendering an image part as `<image>`, an
audio part as `<audio>`).

As the real thinker: layer 0 dense (`first_k_dense_replace` 1), the others MoE with 8
experts in 4 groups (2 groups kept, 2 experts per token), one shared expert,
`MultiRouter`, `video_rope`, half of each head rotating. Weights are N(0, 0.2) for
matrices, N(1, 0.1) for norms, N(0, 0.1) for vectors (so `expert_bias` changes routing).
So that the random model behaves like a usable one, the head keeps only the byte tokens
and `<|im_end|>` (it writes bytes and may end).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from omnistage.families.ming_flash_omni.config import BailingMM2Config, BailingMoeV2Config
from omnistage.families.ming_flash_omni.tiny_audio import (
    AUDIO_SPECIALS,
    AUDIO_WEIGHTS,
    TINY_AUDIO,
    tiny_audio_weights,
)
from omnistage.families.ming_flash_omni.tiny_talker import (
    SPECIALS,
    TALKER_WEIGHTS,
    tiny_talker_config,
    tiny_talker_weights,
)
from omnistage.families.ming_flash_omni.tiny_vision import (
    IMAGE_SPECIALS,
    TINY_VISION,
    VISION_WEIGHTS,
    tiny_vision_weights,
)
from omnistage.families.ming_omni.tiny import CONTENT, draw_weights
from omnistage.models.tiny_checkpoints import CHAT_TEMPLATE, VOCAB_SIZE, byte_tokenizer

IM_END_ID = 2
THINKER = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    use_qkv_bias=False,
    use_qk_norm=True,
    use_bias=False,
    rms_norm_eps=1e-6,
    max_position_embeddings=1024,
    rope_theta=600000.0,
    rope_scaling={"factor": None, "type": "video_rope", "mrope_section": [2, 1, 1]},
    partial_rotary_factor=0.5,
    pad_token_id=0,
    eos_token_id=IM_END_ID,
    num_experts=8,
    num_shared_experts=1,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    routed_scaling_factor=2.5,
    moe_intermediate_size=32,
    first_k_dense_replace=1,
    router_type="MultiRouter",
)


def thinker_shapes(c: BailingMoeV2Config) -> dict[str, tuple[int, ...]]:
    """The reference's thinker parameter names (with the `model.` prefix) and shapes."""
    h, hd = c.hidden_size, c.head_dim
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * hd
    out = {"model.model.word_embeddings.weight": (c.vocab_size, h)}
    for i in range(c.num_hidden_layers):
        p = f"model.model.layers.{i}."
        out[p + "attention.query_key_value.weight"] = (qkv, h)
        out[p + "attention.q_norm.weight"] = (hd,)
        out[p + "attention.k_norm.weight"] = (hd,)
        out[p + "attention.dense.weight"] = (h, c.num_attention_heads * hd)
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        mlps = {"mlp.": c.intermediate_size}
        if i >= c.first_k_dense_replace:
            mlps = {f"mlp.experts.{e}.": c.moe_intermediate_size for e in range(c.num_experts)}
            mlps["mlp.shared_experts."] = c.moe_intermediate_size * c.num_shared_experts
            gates = ("gate", "image_gate", "audio_gate")
            for gate in gates if c.router_type == "MultiRouter" else gates[:1]:
                out[f"{p}mlp.{gate}.weight"] = (c.num_experts, h)
                out[f"{p}mlp.{gate}.expert_bias"] = (c.num_experts,)
        for m, inner in mlps.items():
            out[p + m + "gate_proj.weight"] = (inner, h)
            out[p + m + "up_proj.weight"] = (inner, h)
            out[p + m + "down_proj.weight"] = (h, inner)
    out["model.model.norm.weight"] = (h,)
    out["model.lm_head.weight"] = (c.vocab_size, h)
    return out


def make_tiny_ming_flash_omni(
    path: Path, seed: int = 0, dtype: torch.dtype = torch.float32
) -> Path:
    """Write the seeded tiny checkpoint at `path` (float32 weights drawn, saved in `dtype`)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    llm = BailingMoeV2Config(**THINKER, architectures=["BailingMoeV2ForCausalLM"])
    talker = tiny_talker_config()
    config = BailingMM2Config(
        mlp_depth=2,
        llm_config=llm,
        talker_config=talker.to_dict(),
        vision_config=dict(TINY_VISION),
        audio_config=dict(TINY_AUDIO),
        architectures=["BailingMM2NativeForConditionalGeneration"],
    )
    weights = draw_weights(thinker_shapes(llm), torch.Generator().manual_seed(seed))
    keep = torch.zeros(llm.vocab_size, dtype=torch.bool)
    keep[3:259] = True  # byte tokens
    keep[IM_END_ID] = True
    weights["model.lm_head.weight"][~keep] = 0.0
    save_file({k: v.to(dtype).contiguous() for k, v in weights.items()}, path / "model.safetensors")
    # A file of its own, so that the thinker's file (and its fixture's digest) stays as it was.
    talker_weights = tiny_talker_weights(talker, seed + 1)
    save_file({k: v.to(dtype) for k, v in talker_weights.items()}, path / TALKER_WEIGHTS)
    vision = tiny_vision_weights(llm.hidden_size, config.mlp_depth, seed + 2)
    save_file({k: v.to(dtype).contiguous() for k, v in vision.items()}, path / VISION_WEIGHTS)
    audio = tiny_audio_weights(llm.hidden_size, config.mlp_depth, seed + 3)
    save_file({k: v.to(dtype).contiguous() for k, v in audio.items()}, path / AUDIO_WEIGHTS)
    config.save_pretrained(path)
    tok = byte_tokenizer(SPECIALS + IMAGE_SPECIALS + AUDIO_SPECIALS)
    tok.chat_template = CHAT_TEMPLATE.replace("{{ m['content'] }}", CONTENT)  # image parts
    tok.save_pretrained(path)
    # The class any transformers release reads (the reference pins 4.53).
    settings_file = path / "tokenizer_config.json"
    settings = json.loads(settings_file.read_text())
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    settings_file.write_text(json.dumps(settings, indent=2))
    return path
