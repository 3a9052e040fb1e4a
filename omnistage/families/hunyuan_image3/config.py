"""HunyuanImage-3's `config.json` as a transformers config (`HunyuanImage3Config`).

transformers does not know HunyuanImage-3; its checkpoint declares the config in
`configuration_hunyuan.py` (Tencent-Hunyuan/HunyuanImage-3.0, loaded with
`trust_remote_code`). We read the same keys with the same defaults for the parts we
run: the MoE decoder (`num_experts`, `moe_topk`, `moe_intermediate_size`,
`num_shared_expert` with `use_mixed_mlp_moe`, `moe_layer_num_skipped`,
`attention_head_dim`, `use_qk_norm`, `norm_topk_prob`, `routed_scaling_factor`) and
the image head (`vae`, `patch_size`, `patch_embed_hidden_dim`, `image_base_size`,
`vae_downsample_factor`). The four MoE fields may be one value or one per layer, as
the reference reads them (`LayerMoe` gives a layer's). MLA, cross-layer attention
(CLA), drop-token routing, group-limited routing and a classification head are
refused by name: the released checkpoint uses none of them.

The text positions of HunyuanImage-3 are its 2-D RoPE with equal row and column
indices, which is plain RoPE over `attention_head_dim` with base `rope_theta`, so
the config carries plain `rope_parameters`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import PretrainedConfig

MODEL_TYPE = "hunyuan_image_3_moe"

IMAGE_DEFAULTS: dict[str, Any] = {
    "vae_downsample_factor": (16, 16),
    "img_proj_type": "unet",
    "patch_size": 1,
    "patch_embed_hidden_dim": 1024,
    "image_base_size": 1024,
    "vae": None,
    "vit": None,
    "vit_processor": None,
    "vit_aligner": None,
}
"""The image head's fields and the reference's defaults (`vae`: the VAE's own config,
`vit*`: the vision encoder's, kept as given)."""

_REFUSED_TRUE = ("use_mla", "use_cla", "moe_drop_tokens", "group_limited_greedy")


PerLayer = int | list[int]


@dataclass(frozen=True)
class LayerMoe:
    """One layer's MoE shape."""

    num_experts: int
    top_k: int
    intermediate: int
    """Each expert's SwiGLU width."""
    num_shared: int


def _of_layer(value: Any, layer_idx: int) -> Any:
    return value[layer_idx] if isinstance(value, list) else value


class HunyuanImage3Config(PretrainedConfig):
    model_type = MODEL_TYPE

    def __init__(
        self,
        vocab_size: int = 290943,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        moe_intermediate_size: PerLayer | None = None,
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
        num_experts: PerLayer = 1,
        use_mixed_mlp_moe: bool = False,
        num_shared_expert: PerLayer = 1,
        moe_topk: PerLayer = 1,
        moe_layer_num_skipped: int = 0,
        norm_topk_prob: bool = True,
        routed_scaling_factor: float = 1.0,
        norm_type: str = "hf_rms",
        add_classification_head: bool = False,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("rope_parameters", None)
        attention_head_dim = attention_head_dim or kwargs.pop("head_dim", None)
        # The reference asks for {"type": "custom"}: its own 2-D RoPE (see the module doc).
        rope_scaling = kwargs.pop("rope_scaling", None)
        if rope_scaling is not None and rope_scaling.get("type") != "custom":
            raise ValueError(f"rope_scaling: only type 'custom' is supported, got {rope_scaling}")
        refused = [key for key in _REFUSED_TRUE if kwargs.get(key)]
        image = {key: kwargs.pop(key, value) for key, value in IMAGE_DEFAULTS.items()}
        super().__init__(**kwargs)
        for key, value in image.items():
            setattr(self, key, value)
        self.vae_downsample_factor = list(self.vae_downsample_factor)
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
        self._validate(refused)

    def _validate(self, refused: list[str]) -> None:
        for key in ("num_experts", "moe_topk", "moe_intermediate_size", "num_shared_expert"):
            value = getattr(self, key)
            if isinstance(value, list) and len(value) != self.num_hidden_layers:
                raise ValueError(f"{key}: expected one value per layer ({self.num_hidden_layers})")
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
        for i in range(self.num_hidden_layers):
            moe = self.layer_moe(i)
            if moe is not None and not 1 <= moe.top_k <= moe.num_experts:
                raise ValueError(f"moe_topk: expected 1..num_experts, got {moe.top_k}")

    @property
    def is_moe(self) -> bool:
        """As the reference decides: MoE when any layer has more than one expert."""
        value = self.num_experts
        return (max(value) if isinstance(value, list) else value) > 1

    def layer_moe(self, layer_idx: int) -> LayerMoe | None:
        """Layer `layer_idx`'s MoE shape, or None for a dense feed-forward (the reference
        skips MoE on the first `moe_layer_num_skipped` layers)."""
        if not self.is_moe or layer_idx < self.moe_layer_num_skipped:
            return None
        inner = _of_layer(self.moe_intermediate_size, layer_idx) or self.intermediate_size
        return LayerMoe(
            num_experts=_of_layer(self.num_experts, layer_idx),
            top_k=_of_layer(self.moe_topk, layer_idx),
            intermediate=inner,
            num_shared=_of_layer(self.num_shared_expert, layer_idx),
        )
