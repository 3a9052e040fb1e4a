"""Tiny random-weight checkpoints of the architectures we serve: what the built-in demos,
the tests and the benchmarks build from.

Each is saved in the real HF layout (config.json, safetensors, tokenizer files
with a chat template) so the engine loads it the way it loads a real model.
The tokenizer is byte-level BPE without merges: every byte is a token.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 320
TINY_MOE = dict(
    rope_theta=10000.0,
    moe_intermediate_size=48,
    num_experts=4,
    num_experts_per_tok=2,
    decoder_sparse_step=1,
    mlp_only_layers=[1],  # one sparse and one dense layer
)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer(extra_special_tokens: list[str] | None = None) -> PreTrainedTokenizerFast:
    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(byte_chars):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS + list(extra_special_tokens or []))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_config(arch: str, **overrides):
    common = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    common.update(overrides)
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**common, rope_theta=10000.0)
    if arch == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(**common, rope_theta=10000.0)
    if arch == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(**common, head_dim=32, rope_theta=10000.0)
    if arch == "qwen3_moe":
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(**common, **TINY_MOE, head_dim=32, norm_topk_prob=True)
    if arch == "qwen2_moe":
        from transformers import Qwen2MoeConfig

        return Qwen2MoeConfig(
            **common, **TINY_MOE, shared_expert_intermediate_size=96, norm_topk_prob=False
        )
    if arch == "mamba2":
        from transformers import Mamba2Config

        # A small chunk_size so prompts cross SSD chunk boundaries; residual_in_fp32 off so a
        # float64 checkpoint keeps float64 residuals in transformers too.
        mamba = dict(
            vocab_size=VOCAB_SIZE,
            hidden_size=64,
            expand=2,
            num_heads=8,
            head_dim=16,
            n_groups=2,
            state_size=16,
            conv_kernel=4,
            chunk_size=8,
            num_hidden_layers=2,
            layer_norm_epsilon=1e-6,
            residual_in_fp32=False,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
            tie_word_embeddings=False,
            max_position_embeddings=1024,
        )
        mamba.update(overrides)
        return Mamba2Config(**mamba)
    if arch in ("qwen3_next", "qwen3_5"):
        return _tiny_hybrid_config(arch, common, overrides)
    raise ValueError(arch)


def _tiny_hybrid_config(arch: str, common: dict, overrides: dict):
    """Qwen3-Next / Qwen3.5: 4 layers, 3 gated delta-net ones around 1 gated full-attention
    one (partial rotary); 2 key and 4 value heads in the delta-net."""
    layers = overrides.get("num_hidden_layers", 4)
    hybrid = dict(
        head_dim=16,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=["full_attention" if i % 4 == 1 else "linear_attention" for i in range(layers)],
    )
    hybrid.update(common, num_hidden_layers=layers)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    if arch == "qwen3_next":
        from transformers import Qwen3NextConfig

        return Qwen3NextConfig(
            **hybrid,
            **{k: v for k, v in TINY_MOE.items() if k != "rope_theta"},
            shared_expert_intermediate_size=96,
            norm_topk_prob=True,
            rope_parameters=rope,
        )
    from transformers import Qwen3_5TextConfig

    rope.update(mrope_section=[2, 1, 1], mrope_interleaved=True)
    return Qwen3_5TextConfig(**hybrid, rope_parameters=rope, architectures=["Qwen3_5ForCausalLM"])


def make_checkpoint(
    path: Path,
    arch: str = "llama",
    seed: int = 0,
    dtype=torch.float32,
    extra_special_tokens: list[str] | None = None,
    **overrides,
) -> Path:
    """Save a seeded random `arch` checkpoint (config overrides allowed) with a byte tokenizer."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(arch, **overrides)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    # Random init of transformers is small; scale up so logits are well separated.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
            elif "norm" in name:
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0, 0.1)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    byte_tokenizer(extra_special_tokens).save_pretrained(path)
    return path


def omni_chat_template(audio: str, image: str, video: str) -> str:
    """A Qwen-Omni-style chat template rendering each audio / image / video content item as
    the given placeholder tokens (the processor expands them)."""
    return (
        "{%- for message in messages %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' }}"
        "{%- if message['content'] is string %}{{- message['content'] }}"
        "{%- else %}{%- for item in message['content'] %}"
        "{%- if item['type'] == 'text' %}{{- item['text'] }}"
        "{%- elif item['type'] == 'audio' or 'audio' in item or 'audio_url' in item %}"
        "{{- '" + audio + "' }}"
        "{%- elif item['type'] == 'image' or 'image' in item or 'image_url' in item %}"
        "{{- '" + image + "' }}"
        "{%- elif item['type'] == 'video' or 'video' in item %}"
        "{{- '" + video + "' }}"
        "{%- endif %}{%- endfor %}{%- endif %}"
        "{{- '<|im_end|>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


WHISPER_FEATURE_EXTRACTOR_CONFIG = {
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "sampling_rate": 16000,
    "hop_length": 160,
    "chunk_length": 300,
    "n_fft": 400,
    "n_samples": 4800000,
    "nb_max_frames": 30000,
    "padding_side": "right",
    "padding_value": 0.0,
    "dither": 0.0,
    "return_attention_mask": True,
}
