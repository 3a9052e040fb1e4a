"""HunyuanImage-3's `config.json` as a transformers config (`HunyuanImage3Config`).

transformers does not know HunyuanImage-3; its checkpoint declares the config in
`configuration_hunyuan.py` (Tencent-Hunyuan/HunyuanImage-3.0, loaded with
`trust_remote_code`). We read the same keys with the same defaults for the parts we
run: the MoE decoder (`num_experts`, `moe_topk`, `moe_intermediate_size`,
`num_shared_expert` with `use_mixed_mlp_moe`, `moe_layer_num_skipped`,
`attention_head_dim`, `use_qk_norm`, `norm_topk_prob`, `routed_scaling_factor`) and
the image head (`vae`, `patch_size`, `patch_embed_hidden_dim`, `image_base_size`,
`vae_downsample_factor`). Per-layer lists for the MoE fields, MLA, cross-layer
attention (CLA), drop-token routing, group-limited routing and a classification
head are refused by name: the released checkpoint uses none of them.

The text positions of HunyuanImage-3 are its 2-D RoPE with equal row and column
indices, which is plain RoPE over `attention_head_dim` with base `rope_theta`, so
the config carries plain `rope_parameters`.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

MODEL_TYPE = "hunyuan_image_3_moe"

_REFUSED_TRUE = ("use_mla", "use_cla", "moe_drop_tokens", "group_limited_greedy")


class HunyuanImage3Config(PretrainedConfig):
    model_type = MODEL_TYPE

    def __init__(
        self,
        vocab_size: int = 290943,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        moe_intermediate_size: int | None = None,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        attention_head_dim: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        rms_norm_eps: float = 1e-5,
        rope_theta: float = 10000.0,
        attention_bias: bool = False,
        mlp_bias: bool = False,
        use_qk_norm: bool = False,
        num_experts: int = 1,
        use_mixed_mlp_moe: bool = False,
        num_shared_expert: int = 1,
        moe_topk: int = 1,
        moe_layer_num_skipped: int = 0,
        norm_topk_prob: bool = True,
        routed_scaling_factor: float = 1.0,
        norm_type: str = "hf_rms",
        add_classification_head: bool = False,
        vae_downsample_factor: tuple[int, int] | list[int] = (16, 16),
        img_proj_type: str = "unet",
        patch_size: int = 1,
        patch_embed_hidden_dim: int = 1024,
        image_base_size: int = 1024,
        vae: dict[str, Any] | None = None,
        vit: dict[str, Any] | None = None,
        vit_processor: dict[str, Any] | None = None,
        vit_aligner: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("rope_parameters", None)
        # The reference asks for {"type": "custom"}: its own 2-D RoPE (see the module doc).
        rope_scaling = kwargs.pop("rope_scaling", None)
        if rope_scaling is not None and rope_scaling.get("type") != "custom":
            raise ValueError(f"rope_scaling: only type 'custom' is supported, got {rope_scaling}")
        refused = [key for key in _REFUSED_TRUE if kwargs.get(key)]
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.moe_intermediate_size = moe_intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.attention_head_dim = attention_head_dim or hidden_size // num_attention_heads
        self.head_dim = self.attention_head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.rope_parameters = {"rope_type": "default", "rope_theta": rope_theta}
        self.attention_bias = attention_bias
        self.mlp_bias = mlp_bias
        self.use_qk_norm = use_qk_norm
        self.num_experts = num_experts
        self.use_mixed_mlp_moe = use_mixed_mlp_moe
        self.num_shared_expert = num_shared_expert
        self.moe_topk = moe_topk
        self.moe_layer_num_skipped = moe_layer_num_skipped
        self.norm_topk_prob = norm_topk_prob
        self.routed_scaling_factor = routed_scaling_factor
        self.norm_type = norm_type
        self.add_classification_head = add_classification_head
        self.vae_downsample_factor = list(vae_downsample_factor)
        self.img_proj_type = img_proj_type
        self.patch_size = patch_size
        self.patch_embed_hidden_dim = patch_embed_hidden_dim
        self.image_base_size = image_base_size
        self.vae = vae
        self.vit = vit
        self.vit_processor = vit_processor
        self.vit_aligner = vit_aligner
        self._validate(refused)

    def _validate(self, refused: list[str]) -> None:
        for key in ("num_experts", "moe_topk", "moe_intermediate_size", "num_shared_expert"):
            if isinstance(getattr(self, key), list):
                raise ValueError(f"{key}: per-layer lists are not supported")
        for key in refused:
            raise ValueError(f"{key}: not supported by omnistage's HunyuanImage-3 decoder")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act: only 'silu' is supported, got {self.hidden_act!r}")
        if self.norm_type not in ("hf_rms", "rms"):
            raise ValueError(f"norm_type: only RMSNorm is supported, got {self.norm_type!r}")
        if self.add_classification_head:
            raise ValueError("add_classification_head: not supported")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_key_value_heads: must divide num_attention_heads")
        if self.attention_head_dim % 4:
            raise ValueError("attention_head_dim: the 2-D RoPE needs a multiple of 4")
        if self.num_experts > 1 and not 1 <= self.moe_topk <= self.num_experts:
            raise ValueError(f"moe_topk: expected 1..num_experts, got {self.moe_topk}")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    def layer_is_moe(self, layer_idx: int) -> bool:
        """Whether decoder layer `layer_idx` has the MoE feed-forward (the reference skips
        MoE on the first `moe_layer_num_skipped` layers)."""
        return self.is_moe and layer_idx >= self.moe_layer_num_skipped

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size
