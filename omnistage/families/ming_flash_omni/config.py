"""Ming-flash-omni-2.0's checkpoint config (`model_type` "bailingmm_moe_v2_lite"), as
transformers configs.

A Ming-flash-omni-2.0 checkpoint (inclusionAI's layout, read by `modeling_bailingmm2.py`
of inclusionAI/Ming) is one folder: `config.json` (`BailingMM2Config`: `llm_config`, the
thinker, a Bailing-MoE-V2 decoder; `vision_config`, `audio_config`, `mlp_depth`) and one
set of safetensors for its parts: `model.model.*` / `model.lm_head.weight` (the thinker),
`vision.*`, `linear_proj.*`, `audio.*`, `linear_proj_audio.*`. `talker_config` is read as
`talker_config.MingFlashTalkerConfig` (the talker and its audio VAE decoder).

Field names and defaults are the reference's (`configuration_bailing_moe_v2.py`,
`configuration_bailingmm2.py`, commit 480df09). Fields the reference's text path does not
read are kept but have no effect there, as in the reference: `use_qk_norm` (q and k are
always RMS-normed per head), `norm_topk_prob` (the top-k weights are always renormalized
when more than one is picked), `use_expert_bias` (the bias always exists),
`moe_router_topk_scaling_factor` (the scale is `routed_scaling_factor`).
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

ROPE_TYPES = ("video_rope", "3D", "m_rope")
"""`rope_scaling.type`s the reference's 3-D rotary knows; a text-only prompt has equal
(T, H, W) positions, for which each of them is plain RoPE over the rotary dims."""
ROUTER_TYPES = ("topN", "MultiRouter")


class BailingMoeV2Config(PretrainedConfig):
    """The thinker: a Bailing-MoE-V2 decoder (fused `query_key_value`, per-head `q_norm` /
    `k_norm`, partial RoPE, sigmoid routing over expert groups with `expert_bias`)."""

    model_type = "bailing_moe_v2"

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
        use_qk_norm: bool = False,
        use_bias: bool = True,
        rms_norm_eps: float = 1e-05,
        norm_head: bool = False,
        tie_word_embeddings: bool = False,
        max_position_embeddings: int = 16384,
        rope_theta: float = 10000.0,
        rope_scaling: dict | None = None,
        pad_token_id: int = 126081,
        num_experts: int = 16,
        num_shared_experts: int | None = 0,
        num_experts_per_tok: int = 2,
        n_group: int = 8,
        topk_group: int = 4,
        routed_scaling_factor: float = 2.5,
        moe_intermediate_size: int | None = None,
        first_k_dense_replace: int = 0,
        head_dim: int | None = None,
        partial_rotary_factor: float = 0.5,
        router_type: str = "topN",
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
        self.use_qk_norm = use_qk_norm
        self.use_bias = use_bias
        self.rms_norm_eps = rms_norm_eps
        self.norm_head = norm_head
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        # Not `rope_scaling`: transformers 5 reads that as its own `rope_parameters`
        # (and refuses the reference's types); `to_dict` writes it back under its name.
        self.mm_rope_scaling = rope_scaling
        self.num_experts = num_experts
        self.num_shared_experts = num_shared_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.n_group = n_group
        self.topk_group = topk_group
        self.routed_scaling_factor = routed_scaling_factor
        self.moe_intermediate_size = moe_intermediate_size
        self.first_k_dense_replace = first_k_dense_replace
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.partial_rotary_factor = partial_rotary_factor
        self.router_type = router_type
        super().__init__(
            pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs
        )
        self._validate()

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["rope_scaling"] = out.pop("mm_rope_scaling", None)
        return out

    @property
    def rotary_dim(self) -> int:
        """The leading dims of each head that rotate (the reference's `rope_dim`)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def _validate(self) -> None:
        def refuse(field: str, why: str) -> None:
            raise ValueError(f"llm_config.{field}: {why}")

        if self.hidden_act != "silu":
            refuse("hidden_act", f"{self.hidden_act!r} (only 'silu' is supported)")
        rope = self.mm_rope_scaling
        if rope is not None and rope.get("rope_type", rope.get("type")) not in ROPE_TYPES:
            refuse("rope_scaling", f"{rope!r}: its type must be one of {ROPE_TYPES} or null")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            refuse(
                "partial_rotary_factor", f"rotary dims {self.rotary_dim}: not even in 2..head_dim"
            )
        if self.router_type not in ROUTER_TYPES:
            refuse("router_type", f"{self.router_type!r} (one of {ROUTER_TYPES})")
        if not self.num_experts:
            return
        e, g = self.num_experts, self.n_group
        if g < 1 or e % g or e // g < 2:
            refuse("n_group", f"{g} must split num_experts {e} into groups of 2 or more")
        if not 1 <= self.topk_group <= g:
            refuse("topk_group", f"{self.topk_group} must be in 1..n_group ({g})")
        if not 1 <= self.num_experts_per_tok <= self.topk_group * (e // g):
            refuse(
                "num_experts_per_tok", f"{self.num_experts_per_tok}: more than the kept groups hold"
            )
        if not self.moe_intermediate_size:
            refuse("moe_intermediate_size", "a MoE decoder needs it")


class BailingMM2Config(PretrainedConfig):
    """The whole Ming-flash-omni-2.0 checkpoint (the thinker, the image and audio encoders,
    the talker and its audio VAE are served; `audio_config` is read by `audio.py`)."""

    model_type = "bailingmm_moe_v2_lite"

    def __init__(
        self,
        mlp_depth: int = 1,
        llm_config: dict | BailingMoeV2Config | None = None,
        vision_config: dict | None = None,
        audio_config: dict | None = None,
        talker_config: dict | None = None,
        **kwargs: Any,
    ) -> None:
        self.mlp_depth = mlp_depth
        if isinstance(llm_config, dict):
            llm_config = BailingMoeV2Config(**llm_config)
        self.llm_config = llm_config or BailingMoeV2Config(moe_intermediate_size=256)
        self.vision_config = vision_config
        self.audio_config = audio_config
        if isinstance(talker_config, dict):
            from omnistage.families.ming_flash_omni.talker_config import MingFlashTalkerConfig

            talker_config = MingFlashTalkerConfig(**talker_config)
        self.talker_config = talker_config
        super().__init__(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["llm_config"] = self.llm_config.to_dict()
        if self.talker_config is not None:
            out["talker_config"] = self.talker_config.to_dict()
        return out
