"""Dynin-Omni's checkpoint config: the LLaDA backbone's fields, Dynin's vocabulary layout
and the generation settings of its three stages.

A Dynin-Omni checkpoint (snu-aidas/Dynin-Omni) is a LLaDA masked-diffusion language
model (`DyninOmniModelLM`, a `LLaDAModelLM`) whose `config.json` holds LLaDA's
`ModelConfig` fields (`d_model`, `n_heads`, `n_layers`, `mlp_hidden_size`,
`embedding_size`, `mask_token_id`, …) and Dynin's own (`llm_vocab_size`,
`codebook_size`, `num_vq_tokens`, `new_vocab_size`, …). Its vocabulary is the text
tokenizer's ids, then `codebook_size` image codes (MAGVITv2), then
`audio_codebook_size` speech units (EMOVA). The image decoder is a separate MAGVITv2
checkpoint (`vq_model_image/` here, `vq_model_image_path` in Dynin's inference config).

Fields the reference takes from its inference YAML at run time (steps, block lengths,
lengths of the generated regions) are optional keys here with the reference's demo
defaults, so a tiny checkpoint states its own.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from transformers import PretrainedConfig

MODEL_TYPE = "dynin_omni"
VQ_IMAGE_DIR = "vq_model_image"
SPECIAL_TOKENS = ("<|soi|>", "<|eoi|>", "<|soa|>", "<|eoa|>", "<|mdm_mask|>")
"""Dynin's start/end of image and audio tokens and the masked-diffusion mask token."""
TEMPLATE_TOKENS = (
    "<|t2s|>",
    "<|t2i|>",
    "[iPAD]",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
"""The speech template's task and padding tokens and the chat headers (the tiny tokenizer's;
a real checkpoint has them as reserved or LLaMA-3 ids)."""


class DyninOmniHFConfig(PretrainedConfig):
    """transformers' view of a Dynin-Omni `config.json` (every key kept as an attribute)."""

    model_type = MODEL_TYPE


@dataclass(frozen=True)
class DyninOmniConfig:
    """The fields of a Dynin-Omni `config.json` omnistage reads (LLaDA's names)."""

    d_model: int
    """Hidden size."""
    n_heads: int
    """Attention heads."""
    n_layers: int
    """Transformer blocks (LLaDA `llama` blocks)."""
    vocab_size: int
    """Ids the model knows: text, image codes and speech units."""
    llm_vocab_size: int
    """Text ids (the tokenizer's length): image codes start here."""
    codebook_size: int
    """Image codes (MAGVITv2's codebook, 2**codebook bits)."""
    audio_codebook_size: int
    """Speech units (EMOVA's codebook); they start at `llm_vocab_size + codebook_size`."""
    mask_token_id: int
    """The masked-diffusion mask id (LLaDA's `<|mdm_mask|>`)."""
    eos_token_id: int
    """The end of a text answer."""
    n_kv_heads: int | None = None
    """Key/value heads (None: `n_heads`)."""
    mlp_hidden_size: int | None = None
    """Feed-forward width (None: `mlp_ratio * d_model`)."""
    mlp_ratio: int = 4
    """Feed-forward width over `d_model` when `mlp_hidden_size` is not given."""
    embedding_size: int | None = None
    """Rows of the embedding and output tables (None: `vocab_size`)."""
    rope_theta: float = 10000.0
    """RoPE base."""
    rms_norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    max_sequence_length: int = 4096
    """The longest sequence (prompt and generated region) the model takes."""
    weight_tying: bool = False
    """Whether the output head is the embedding table."""
    include_bias: bool = False
    """Biases on every linear layer."""
    include_qkv_bias: bool = False
    """Biases on the query/key/value projections."""
    scale_logits: bool = False
    """Whether logits are scaled by 1/sqrt(d_model)."""
    activation_type: str = "silu"
    """The feed-forward gate's activation (LLaDA's llama blocks: silu)."""
    block_type: str = "llama"
    """LLaDA's block type (only `llama` is served)."""
    layer_norm_type: str = "rms"
    """LLaDA's norm type (only `rms` is served)."""
    rope: bool = True
    """RoPE positions (LLaDA's masked diffusion requires them)."""
    attention_layer_norm: bool = False
    """Query/key norms (not used by LLaDA; refused)."""
    text_max_new_tokens: int = 64
    """Length of the masked answer region of a text task."""
    text_steps: int = 64
    """Denoising steps of a text answer (over all its blocks)."""
    text_block_length: int = 32
    """Semi-autoregressive block length of a text answer."""
    num_vq_tokens: int = 256
    """Image codes of one generated image (a square grid)."""
    image_steps: int = 16
    """Denoising steps of an image (MaskGIT)."""
    image_temperature: float = 1.0
    """Gumbel temperature of the image's re-masking, annealed to 0 over the steps."""
    audio_max_new_tokens: int = 128
    """Length of the masked speech-unit region."""
    audio_steps: int = 64
    """Denoising steps of the speech units (over all their blocks)."""
    audio_block_length: int = 64
    """Semi-autoregressive block length of the speech units."""
    t2i_max_text_len: int = 128
    """`UniversalPrompting`'s `max_text_len` for image requests (vLLM-Omni's t2i
    `prompt_max_text_len`): the text part is padded or cut to one more position."""
    t2s_max_text_len: int = 1024
    """The same for speech requests (vLLM-Omni's t2s `prompt_max_text_len`)."""
    t2s_instruction: str = "Please read the following text naturally."
    """The instruction before the text of a speech request (vLLM-Omni's default)."""
    t2s_token_id: int = 126099
    """`<|t2s|>` (Dynin's reserved id)."""
    t2i_token_id: int = 126088
    """`<|t2i|>` (Dynin's reserved id)."""
    image_guidance_scale: float = 3.5
    """Classifier-free guidance of the image codes against the empty text's template (0: off;
    3.5: Dynin's t2i `guidance_scale`)."""
    ipad_token_id: int = 126093
    """`[iPAD]`, the templates' left padding (Dynin's reserved id)."""
    mmu_token_id: int = 126089
    """`<|mmu|>`, the task token of image understanding (Dynin's reserved id)."""
    mmu_image_resolution: int = 336
    """Pixels a side an input image is resized and cropped to (vLLM-Omni's i2t
    `image_resolution` default)."""
    s2t_token_id: int = 126096
    """`<|s2t|>`, the task token of speech understanding (Dynin's reserved id)."""
    s2t_instruction: str = "Transcribe the given audio."
    """The instruction of a speech request without text (vLLM-Omni's s2t default)."""
    s2t_reduce_units: bool = True
    """Collapse repeated consecutive speech units (EMOVA's `s2u_extract_unit_demo` default)."""
    s2t_max_seconds: float = 60.0
    """Longest speech input (EMOVA's demo extracts up to 960000 samples at 16 kHz at once)."""
    s2t_max_new_tokens: int = 128
    """Length of the masked answer region of a speech question (vLLM-Omni's s2t default)."""
    s2t_steps: int = 256
    """Denoising steps of that answer (vLLM-Omni's s2t default)."""
    s2t_block_length: int = 2
    """Its semi-autoregressive block length (vLLM-Omni's s2t default)."""
    audio_cfg_scale: float = 2.5
    """Classifier-free guidance of the speech units against their region all masked (0: off;
    2.5: Dynin's t2s `cfg_scale`)."""

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_layers", "vocab_size", "llm_vocab_size"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads: {self.n_heads} does not divide d_model {self.d_model}")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_kv_heads: {self.kv_heads} does not divide n_heads")
        if self.block_type != "llama" or self.layer_norm_type != "rms" or not self.rope:
            raise ValueError(
                "block_type/layer_norm_type/rope: only LLaDA llama blocks with RMSNorm and "
                f"RoPE are served, got {self.block_type!r}/{self.layer_norm_type!r}/{self.rope}"
            )
        if self.activation_type != "silu":
            raise ValueError(
                f"activation_type: only 'silu' is served, got {self.activation_type!r}"
            )
        if self.attention_layer_norm:
            raise ValueError("attention_layer_norm: query/key norms are not served")
        end = self.llm_vocab_size + self.codebook_size + self.audio_codebook_size
        if end > self.table_size:
            raise ValueError(
                f"audio_codebook_size: text, image and speech ids end at {end}, past the "
                f"{self.table_size} rows of the embedding table"
            )
        for name in ("text", "audio", "s2t"):
            length, block = (
                getattr(self, f"{name}_max_new_tokens"),
                getattr(self, f"{name}_block_length"),
            )
            if length <= 0 or block <= 0 or length % block:
                raise ValueError(
                    f"{name}_block_length: {block} must divide {name}_max_new_tokens {length}"
                )
            if getattr(self, f"{name}_steps") % (length // block):
                raise ValueError(f"{name}_steps: must be a multiple of the number of blocks")
        for name in ("audio_cfg_scale", "image_guidance_scale"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ff_size(self) -> int:
        return self.mlp_hidden_size or self.mlp_ratio * self.d_model

    @property
    def table_size(self) -> int:
        return self.embedding_size or self.vocab_size

    @property
    def image_start(self) -> int:
        return self.llm_vocab_size

    @property
    def audio_start(self) -> int:
        return self.llm_vocab_size + self.codebook_size

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DyninOmniConfig:
        """The fields this class knows from a `config.json` dict (others are ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})
