"""A tiny random-weight MiMo-Audio checkpoint in the real layout (the built-in
`demo-mimo-audio`).

Written as the Hub publishes it (`layout.py` reads it through the same view as a real
checkpoint): `config.json` (the LM: Qwen2 fields plus MiMo-Audio's, `model_type` qwen2,
architectures `MiMoAudioModel`, no `<|empty|>` id), `generation_config.json`, a byte-level tokenizer with
MiMo-Audio's special tokens and a chat template whose assistant turn opens with
`<|sostm|>` (the reference's spoken-reply prompt), the weights in two shards with their
`model.safetensors.index.json`, by the reference's parameter names (`model.*`, `lm_head`, `local_transformer.*`,
`input_local_transformer.*`, `local_transformer_lm_heads.*`, `speech_embeddings.*`,
`speech_group_downcast`, `hidden_states_downcast`), and the audio tokenizer under
`audio_tokenizer/` (its `config.json` fields and every tensor of the reference's
`MiMoAudioTokenizer`, encoder included, by their names).

The real geometry at a small scale: 8 channels, groups of 4 frames, delays 0..7,
per-channel vocab sizes with the empty id one past each codebook. The `<|empty|>` row of
the LM head is pointed along the hidden states' steady direction, so that the tiny LM
speaks at most positions but not all: both the speech and the text filter are exercised.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

SPECIALS = [
    "<|sosp|>",
    "<|eosp|>",
    "<|empty|>",
    "<|Human|>",
    "<|SpeechLM|>",
    "<|sostm|>",
    "<|eostm|>",
    "<|eot|>",
]
EMPTY_ID = 261  # byte tokenizer: 3 specials, 256 bytes, then SPECIALS in order
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for item in m['content'] %}"
    "{% if item['type'] == 'text' %}{{ item['text'] }}"
    "{% elif item['type'] == 'audio' or 'audio' in item or 'input_audio' in item %}"
    "<|sosp|><|empty|><|eosp|>{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<|sostm|>{% endif %}"
)
"""String content as it is; an audio part as the audio span `audio_input.py` expands."""
SPEECH_SIZES = [16, 16, 8, 8, 8, 8, 8, 8]
EMPTY_LOGIT = 4.0
"""Length of the `<|empty|>` head row (how often the tiny LM speaks)."""


def tiny_lm_config() -> dict:
    return dict(
        architectures=["MiMoAudioModel"],
        model_type="qwen2",
        vocab_size=272,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=640000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        speech_vocab_size="-".join(str(n + 1) for n in SPEECH_SIZES),
        speech_zeroemb_idx="-".join(str(n) for n in SPEECH_SIZES),
        delay_pattern="0-1-2-3-4-5-6-7",
        group_size=4,
        audio_channels=8,
        local_dim=16,
        local_layers=1,
        local_attn_heads=2,
        local_ffn_dim=32,
        local_attn_dropout=0.1,
        input_local_layers=1,
        input_local_dim=16,
        input_full_attention=True,
        torch_dtype="float32",
    )


def tiny_tokenizer_config() -> dict:
    return dict(
        model_type="mimo_audio_tokenizer",
        architectures=["MiMoAudioTokenizer"],
        max_audio_seconds=1800,
        stride_size=2,
        avg_pooler=2,
        d_model=16,
        scale_embedding=False,
        kernel_size=3,
        activation_function="gelu",
        encoder_layers=1,
        encoder_attention_heads=2,
        encoder_ffn_dim=32,
        encoder_causal=False,
        decoder_layers=1,
        decoder_attention_heads=2,
        decoder_ffn_dim=32,
        decoder_kernel_size=3,
        decoder_stride_size=2,
        decoder_causal=True,
        nfft=16,
        vocoder_dim=16,
        vocoder_intermediate_dim=32,
        vocoder_num_layers=1,
        n_mels=8,
        sampling_rate=24000,
        hop_length=4,
        window_size=16,
        num_quantizers=10,
        codebook_size=SPEECH_SIZES + [8, 8],
        rope_theta=10000,
        rope_type="default",
        ln_type="LayerNorm",
        vocoder_attention_heads=2,
        vocoder_attn_window_size=[40, 10],
    )


def _decoder_shapes(prefix: str, c: dict, width: str) -> dict[str, tuple[int, ...]]:
    """A Qwen2 stack's layer tensors (`width` names the config's width field)."""
    hidden = c[width]
    shapes = {}
    for i in range(c["layers"]):
        at = f"{prefix}.{i}"
        q, kv = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
        shapes |= {
            f"{at}.self_attn.q_proj.weight": (q, hidden),
            f"{at}.self_attn.q_proj.bias": (q,),
            f"{at}.self_attn.k_proj.weight": (kv, hidden),
            f"{at}.self_attn.k_proj.bias": (kv,),
            f"{at}.self_attn.v_proj.weight": (kv, hidden),
            f"{at}.self_attn.v_proj.bias": (kv,),
            f"{at}.self_attn.o_proj.weight": (hidden, q),
            f"{at}.mlp.gate_proj.weight": (c["inner"], hidden),
            f"{at}.mlp.up_proj.weight": (c["inner"], hidden),
            f"{at}.mlp.down_proj.weight": (hidden, c["inner"]),
            f"{at}.input_layernorm.weight": (hidden,),
            f"{at}.post_attention_layernorm.weight": (hidden,),
        }
    return shapes


def lm_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of the LM checkpoint, by the reference's name, and its shape."""
    h, v, g = config["hidden_size"], config["vocab_size"], config["group_size"]
    main = dict(
        hidden=h,
        layers=config["num_hidden_layers"],
        heads=config["num_attention_heads"],
        kv_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"],
        inner=config["intermediate_size"],
    )
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    shapes |= _decoder_shapes("model.layers", main, "hidden")
    shapes["lm_head.weight"] = (v, h)
    for name, width, layers, inner in (
        ("local_transformer", config["local_dim"], config["local_layers"], config["local_ffn_dim"]),
        (
            "input_local_transformer",
            config["input_local_dim"],
            config["input_local_layers"],
            4 * config["input_local_dim"],
        ),
    ):
        heads = config["local_attn_heads"]
        c = dict(hidden=width, layers=layers, heads=heads, kv_heads=heads, inner=inner)
        c["head_dim"] = width // heads
        shapes |= _decoder_shapes(f"{name}.layers", c, "hidden")
        shapes[f"{name}.norm.weight"] = (width,)
    for i, n in enumerate(SPEECH_SIZES):
        shapes[f"local_transformer_lm_heads.{i}.weight"] = (n + 1, config["local_dim"])
        shapes[f"speech_embeddings.{i}.weight"] = (n + 1, config["input_local_dim"])
    shapes["speech_group_downcast.weight"] = (h, config["input_local_dim"] * g)
    shapes["hidden_states_downcast.weight"] = (config["local_dim"], h)
    return shapes


def random_lm_weights(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Seeded: norms N(1, 0.1), biases N(0, 0.1), matrices N(0, 0.3), embeddings N(0, 1);
    the decoder's value biases N(0, 1): every position's attention adds their projection,
    a steady direction of the hidden states, along which the `<|empty|>` head row points and the end-of-turn rows zero, so the demo speaks until `max_tokens`."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in lm_shapes(config).items():
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.startswith("model.") and name.endswith("v_proj.bias"):
            value = torch.randn(shape, generator=g)  # the steady direction (see below)
        elif name.endswith("bias"):
            value = 0.1 * torch.randn(shape, generator=g)
        elif "embed" in name:
            value = torch.randn(shape, generator=g)
        else:
            value = 0.3 * torch.randn(shape, generator=g)
        out[name] = value
    head = out["lm_head.weight"]
    direction = out["model.norm.weight"] * sum(
        out[f"model.layers.{i}.self_attn.o_proj.weight"]
        @ out[f"model.layers.{i}.self_attn.v_proj.bias"]
        .view(2, -1)
        .repeat_interleave(2, 0)
        .flatten()
        for i in range(config["num_hidden_layers"])
    )
    head[EMPTY_ID] = EMPTY_LOGIT * direction / direction.norm()
    head[2] = head[EMPTY_ID + 4] = 0.0  # <|im_end|>, <|eostm|>
    return out


def tokenizer_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of the reference's `MiMoAudioTokenizer`: the decoder's from our
    module (its names are the reference's: the fixture loads them strictly), the
    encoder's and the quantizer's by table."""
    from omnistage.families.mimo_audio.audio_decoder import AudioDecoder
    from omnistage.families.mimo_audio.config import AudioDecoderConfig

    decoder = AudioDecoder(AudioDecoderConfig.from_dict(config))
    shapes = {f"decoder.{k}": tuple(v.shape) for k, v in decoder.state_dict().items()}
    d, k, mels = config["d_model"], config["kernel_size"], config["n_mels"]
    shapes |= {
        "encoder.conv1.weight": (d, mels, k),
        "encoder.conv1.bias": (d,),
        "encoder.conv2.weight": (d, d, k),
        "encoder.conv2.bias": (d,),
        "encoder.layer_norm.weight": (d,),
        "encoder.layer_norm.bias": (d,),
        "encoder.down_sample_layer.0.weight": (d, d, config["avg_pooler"]),
        "encoder.down_sample_norm.weight": (d,),
        "encoder.down_sample_norm.bias": (d,),
    }
    for name, shape in shapes.copy().items():
        if name.startswith("decoder.layers.0."):
            for i in range(config["encoder_layers"]):
                shapes[name.replace("decoder.layers.0.", f"encoder.layers.{i}.")] = shape
    for i, n in enumerate(config["codebook_size"]):
        at = f"encoder.quantizer.vq.layers.{i}._codebook"
        shapes |= {
            f"{at}.inited": (1,),
            f"{at}.cluster_size": (n,),
            f"{at}.embed": (n, d),
            f"{at}.embed_avg": (n, d),
        }
    return shapes


def random_tokenizer_weights(config: dict, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    out = {}
    for name, shape in tokenizer_shapes(config).items():
        if name.endswith("istft.window"):
            value = torch.hann_window(shape[0])
        elif name.endswith((".inited", "cluster_size")):
            value = torch.ones(shape)
        elif "norm" in name and name.endswith("weight"):
            value = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("bias"):
            value = 0.1 * torch.randn(shape, generator=g)
        else:
            value = 0.3 * torch.randn(shape, generator=g)
        out[name] = value
    return out


def tiny_tokenizer():
    from omnistage.models.tiny_checkpoints import byte_tokenizer

    tok = byte_tokenizer(SPECIALS)
    tok.chat_template = CHAT_TEMPLATE
    if tok.convert_tokens_to_ids("<|empty|>") != EMPTY_ID:
        raise RuntimeError(f"tiny tokenizer: <|empty|> is not id {EMPTY_ID}")
    return tok


def _save_sharded(weights: dict[str, torch.Tensor], path: Path) -> None:
    """Two shards (`model-0000i-of-00002.safetensors`, the LM's layers apart from the
    rest) and `model.safetensors.index.json`, as the Hub's checkpoints are stored."""
    from safetensors.torch import save_file

    names = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    index = {k: names[0 if k.startswith("model.") else 1] for k in weights}
    for name in names:
        shard = {k: v.contiguous() for k, v in weights.items() if index[k] == name}
        save_file(shard, path / name, metadata={"format": "pt"})
    size = sum(v.numel() * v.element_size() for v in weights.values())
    body = {"metadata": {"total_size": size}, "weight_map": dict(sorted(index.items()))}
    (path / "model.safetensors.index.json").write_text(json.dumps(body, indent=2))


def make_tiny_mimo_audio(path: str | Path, seed: int = 0) -> Path:
    """Write the tiny checkpoint to `path` (created) and return it."""
    from safetensors.torch import save_file

    path = Path(path)
    (path / "audio_tokenizer").mkdir(parents=True, exist_ok=True)
    config = tiny_lm_config()
    weights = random_lm_weights(config, seed)
    _save_sharded(weights, path)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    generation = dict(eos_token_id=[2, tiny_tokenizer().convert_tokens_to_ids("<|eostm|>")])
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))
    tiny_tokenizer().save_pretrained(path)
    codec = tiny_tokenizer_config()
    codec_weights = random_tokenizer_weights(codec, seed)
    save_file(
        {k: v.contiguous() for k, v in codec_weights.items()},
        path / "audio_tokenizer" / "model.safetensors",
    )
    (path / "audio_tokenizer" / "config.json").write_text(json.dumps(codec, indent=2))
    return path


def make_demo_mimo_audio(path: str | Path, seed: int = 0) -> Path:
    """The built-in demo: the tiny checkpoint as published in `path/published`, its
    served view (`layout.convert`) in `path`."""
    from omnistage.families.mimo_audio.layout import convert

    path = Path(path)
    make_tiny_mimo_audio(path / "published", seed)
    convert(path / "published", path)
    return path


CLIP_SAMPLES = (24048, 144)
"""The clips the encoder's fixture encodes (at the tiny hop of 4 samples: 6013 mel frames,
two segments whose second pools an odd tail; 37 frames, one segment, an odd tail)."""


AUDIO_IN_SAMPLES = 1600
"""The spoken prompt of the fixture: 0.1 s at 16 kHz (38 LM positions of speech)."""


def tiny_clip(samples: int) -> torch.Tensor:
    """A deterministic test clip: a chirp plus a tone, float32 in [-0.8, 0.8]."""
    t = torch.arange(samples, dtype=torch.float64) / 24000.0
    chirp = torch.sin(2 * torch.pi * (200.0 + 2000.0 * t) * t)
    return (0.5 * chirp + 0.3 * torch.sin(2 * torch.pi * 3100.0 * t)).float()
