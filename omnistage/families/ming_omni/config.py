"""Ming-Omni's checkpoint config (`model_type` "bailingmm"), as transformers configs.

A Ming-Omni checkpoint (inclusionAI's Ming-Lite-Omni layout, the one
`inclusionAI/Ming` publishes) is one folder:

- `config.json`: `BailingMMConfig` with `llm_config` (the thinker, a Bailing-MoE
  decoder), `vision_config` (a Qwen2.5-VL ViT), `audio_config` (a SANM encoder),
  `talker_config` (the talker's settings) and `mlp_depth` (the projectors' depth);
- one set of safetensors for all parts: `model.model.*` / `model.lm_head.weight`
  (thinker), `vision.*`, `linear_proj.*`, `audio.*`, `linear_proj_audio.*`,
  `talker.model.model.*` / `talker.model.lm_head.weight` (the talker's Qwen2),
  `talker.thinker_to_talker_proj.*`, `talker.vp_head.*`;
- `talker/`: the talker's Qwen2 `config.json`, its tokenizer, and `s3_bpe/`
  (`tokenizer.json`, `char_mapping.txt`: the BPE over speech tokens), plus the
  vocoder (`audio_detokenizer.yaml`, `flow.pt`, `hift.pt`).

The reference builds the talker's Qwen2 from `talker/config.json`;
`BailingMMConfig.talker_qwen2` reads that file (unless `talker_config.llm_config`
states it) and the talker's end id (`<audio_eos>` of the talker tokenizer), so the
talker part is an ordinary sub-config. Field names and defaults are the
reference's (`configuration_bailing_moe.py`, `configuration_bailing_talker.py`,
`configuration_bailingmm.py`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig, Qwen2Config

TALKER_DIR = "talker"
AUDIO_EOS = "<audio_eos>"


class BailingMoeConfig(PretrainedConfig):
    """The thinker: a Bailing-MoE decoder (fused `query_key_value`, `dense`, a router
    `gate` plus `image_gate` / `audio_gate` when `multi_gate`, shared experts)."""

    model_type = "bailing_moe"

    def __init__(
        self,
        vocab_size: int = 30592,
        hidden_size: int = 1024,
        intermediate_size: int | None = None,
        num_hidden_layers: int = 24,
        num_attention_heads: int = 16,
        num_key_value_heads: int = 0,
        hidden_act: str = "silu",
        use_qkv_bias: bool = False,
        use_bias: bool = True,
        rms_norm_eps: float = 1e-05,
        norm_head: bool = False,
        tie_word_embeddings: bool = False,
        max_position_embeddings: int = 16384,
        rope_theta: float = 10000.0,
        rope_scaling: dict | None = None,
        pad_token_id: int = 126081,
        num_experts: int = 16,
        num_shared_experts: int = 0,
        num_experts_per_tok: int = 2,
        norm_topk_prob: bool = True,
        moe_intermediate_size: int | None = None,
        first_k_dense_replace: int = 0,
        head_dim: int | None = None,
        multi_gate: bool = False,
        image_patch_token: int = 126346,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.use_qkv_bias = use_qkv_bias
        self.use_bias = use_bias
        self.rms_norm_eps = rms_norm_eps
        self.norm_head = norm_head
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.num_experts = num_experts
        self.num_shared_experts = num_shared_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.norm_topk_prob = norm_topk_prob
        self.moe_intermediate_size = moe_intermediate_size
        self.first_k_dense_replace = first_k_dense_replace
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.multi_gate = multi_gate
        self.image_patch_token = image_patch_token
        super().__init__(
            pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs
        )
        if hidden_act != "silu":
            raise ValueError(f"llm_config.hidden_act: {hidden_act!r} (only 'silu' is supported)")
        if rope_scaling is not None:
            raise ValueError("llm_config.rope_scaling: only plain RoPE (null) is supported")


class BailingTalkerConfig(PretrainedConfig):
    """The talker's settings (`configuration_bailing_talker.py`); its Qwen2 decoder's own
    config is `talker/config.json`, read into `llm_config` by `BailingMMConfig`."""

    model_type = "bailing_talker"

    def __init__(
        self,
        qa_model_hidden_size: int = 2048,
        vocab_size: int = 184445,
        text_vocab_size: int = 151677,
        audio_vocab_size: int = 32768,
        vp_feature_size: int = 192,
        vp_kernel_size: int = 1,
        vp_stride: int = 1,
        llm_config: dict | Qwen2Config | None = None,
        audio_eos_token_id: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.qa_model_hidden_size = qa_model_hidden_size
        self.vocab_size = vocab_size
        self.text_vocab_size = text_vocab_size
        self.audio_vocab_size = audio_vocab_size
        self.vp_feature_size = vp_feature_size
        self.vp_kernel_size = vp_kernel_size
        self.vp_stride = vp_stride
        if isinstance(llm_config, dict):
            llm_config = Qwen2Config(**llm_config)
        self.llm_config = llm_config
        self.audio_eos_token_id = audio_eos_token_id
        super().__init__(**kwargs)
        if vp_kernel_size % 2 != 1:
            raise ValueError(f"talker_config.vp_kernel_size: {vp_kernel_size} must be odd")

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if isinstance(self.llm_config, Qwen2Config):
            out["llm_config"] = self.llm_config.to_dict()
        return out

    @property
    def qwen2(self) -> Qwen2Config:
        """The talker's Qwen2 config, its vocabulary resized to `vocab_size` (as the
        reference's `resize_token_embeddings(config.vocab_size)`)."""
        if self.llm_config is None:
            raise ValueError(f"talker_config: no {TALKER_DIR}/config.json (the talker's Qwen2)")
        config = Qwen2Config(**self.llm_config.to_dict())
        config.vocab_size = self.vocab_size
        config.tie_word_embeddings = False
        return config


class BailingMMConfig(PretrainedConfig):
    """The whole Ming-Omni checkpoint."""

    model_type = "bailingmm"

    def __init__(
        self,
        mlp_depth: int = 1,
        llm_config: dict | BailingMoeConfig | None = None,
        vision_config: dict | None = None,
        audio_config: dict | None = None,
        talker_config: dict | BailingTalkerConfig | None = None,
        **kwargs: Any,
    ) -> None:
        self.mlp_depth = mlp_depth
        if isinstance(llm_config, dict):
            llm_config = BailingMoeConfig(**llm_config)
        self.llm_config = llm_config or BailingMoeConfig()
        self.vision_config = vision_config
        self.audio_config = audio_config
        if isinstance(talker_config, dict):
            talker_config = BailingTalkerConfig(**talker_config)
        self.talker_config = talker_config
        super().__init__(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["llm_config"] = self.llm_config.to_dict()
        if self.talker_config is not None:
            out["talker_config"] = self.talker_config.to_dict()
        return out

    @property
    def talker_qwen2(self) -> Qwen2Config:
        """The talker part's config: its Qwen2 (`talker_config.llm_config`, else the
        checkpoint's `talker/config.json`) with the vocabulary the talker resizes it to,
        ending at the talker tokenizer's `<audio_eos>`."""
        talker = self.talker_config
        if talker is None:
            raise ValueError("talker_config: this checkpoint has no talker")
        talker_dir = Path(self._name_or_path) / TALKER_DIR
        if talker.llm_config is None and (talker_dir / "config.json").is_file():
            talker.llm_config = Qwen2Config.from_pretrained(talker_dir)
        if talker.audio_eos_token_id is None and (talker_dir / "tokenizer.json").is_file():
            talker.audio_eos_token_id = added_token_id(talker_dir, AUDIO_EOS)
        config = talker.qwen2
        config.eos_token_id = talker.audio_eos_token_id
        return config


def added_token_id(tokenizer_dir: Path, token: str) -> int:
    """The id of special token `token` in `tokenizer_dir/tokenizer.json` (ValueError if absent)."""
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    for added in data.get("added_tokens", []):
        if added.get("content") == token:
            return int(added["id"])
    raise ValueError(f"{tokenizer_dir}/tokenizer.json: no special token {token!r}")
