"""A tiny random-weight Ming-Omni checkpoint (`BailingMMNativeForConditionalGeneration`
layout): the built-in `demo-ming-omni` and what the tests build from.

The real layout at small sizes (`config.py` describes it): `config.json`
(`BailingMMConfig` with the real field names; a Qwen2.5-ViT `vision_config`, a SANM
`audio_config`), `preprocessor_config.json` (the image processor's settings, small images;
`wav_frontend_args`, the audio features' settings, with `am.mvn`),
`model.safetensors` with the reference's weight names (`model.model.word_embeddings.weight`,
`model.model.layers.N.attention.query_key_value.weight`, `...mlp.gate.weight`,
`...mlp.image_gate.weight`, `...mlp.experts.E.gate_proj.weight`,
`...mlp.shared_experts.up_proj.weight`, `model.lm_head.weight`,
`talker.model.model.layers.N.self_attn.q_proj.bias`, `talker.model.lm_head.weight`,
`talker.thinker_to_talker_proj.weight`, `talker.vp_head.weight`, …), the thinker's
byte-level tokenizer (with a ChatML template, not Ming's, and the image tokens), and `talker/` with the
talker's Qwen2 `config.json`, its byte-level tokenizer carrying the talker's special
tokens, and one speaker (`spks/luna.pt`, a `[1, 192]` embedding).

Weights are N(0, 0.2) for matrices, N(1, 0.1) for norms, N(0, 0.1) for biases. So
that the random model behaves like a usable one, the thinker's head keeps only the
byte tokens and `<|im_end|>` (it writes bytes and may end), and the talker's head
only the speech ids and `<audio_eos>`.

The image encoder's weights (`vision.*`, `linear_proj.*`) are a second shard,
`vision.safetensors`, drawn from their own generator (seed + 1): `model.safetensors` is
byte for byte what it was before the encoder existed, which the reference fixtures
check. Its `out_hidden_size` is 8192 because the reference fixes the projector's input
width to 8192 (`image_emb_dim`).

The audio encoder's weights (`audio.*`, `linear_proj_audio.*`) are a third shard,
`audio.safetensors` (generator seed + 2; `am.mvn` from seed + 3), so both earlier shards
stay as they were.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from omnistage.families.ming_omni.config import BailingMMConfig, BailingMoeConfig
from omnistage.families.ming_omni.prompt import SPEAKERS_DIR
from omnistage.models.tiny_checkpoints import CHAT_TEMPLATE, VOCAB_SIZE, byte_tokenizer

TALKER_SPECIALS = [
    "<prompt>",
    "</prompt>",
    "<thinker_prefix>",
    "</thinker_prefix>",
    "<audio_pad>",
    "<vp>",
    "</vp>",
    "<audio_bos>",
    "<audio_eos>",
    "<text_eos>",
    "<text_pad>",
]
IMAGE_SPECIALS = ["<image>", "<imagePatch>", "</image>"]
"""The thinker tokenizer's image tokens (ids 259, 260, 261: after the bytes)."""
AUDIO_SPECIALS = ["<audio>", "<audioPatch>", "</audio>"]
"""The thinker tokenizer's audio tokens (ids 262, 263, 264)."""
FRONTEND = dict(cmvn_file="am.mvn", n_mels=20, frame_length=25, frame_shift=10, lfr_m=7, lfr_n=6)
"""`wav_frontend_args` (the reference's `WavFrontend`; the real one has 80 bins, LFR 7 / 6)."""
AUDIO = dict(
    audio_encoder_output_size=32,
    ds_kernel_size=3,
    ds_stride=1,
    norm_query_embeds=True,
    audio_encoder_config_sanm=dict(
        input_size=20 * 7,
        output_size=32,
        attention_heads=2,
        linear_units=48,
        num_blocks=2,
        input_layer="pe",
        kernel_size=5,
        sanm_shfit=0,
        normalize_before=True,
        selfattention_layer_type="sanm",
    ),
)
VISION = dict(
    depth=2,
    hidden_size=32,
    hidden_act="silu",
    intermediate_size=48,
    num_heads=2,
    in_channels=3,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    tokens_per_second=4,
    window_size=112,
    out_hidden_size=8192,
    fullatt_block_indexes=[1],
)
PREPROCESSOR = dict(
    image_processor_type="BailingMMImageProcessor",
    min_pixels=56 * 56,
    max_pixels=28 * 28 * 64,
    patch_size=14,
    merge_size=2,
    temporal_patch_size=2,
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
)
CONTENT = (
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<image>{% elif p['type'] == 'audio' %}<audio>"
    "{% else %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
)
"""A message's content in the tiny thinker's chat template: its text, each image part as
`<image>`, each audio part as `<audio>` (where the reference's `apply_chat_template` puts it; the input encoder expands it)."""
AUDIO_VOCAB = 64
"""Speech BPE ids of the tiny talker (after its text ids)."""
IM_END_ID = 2
THINKER = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    use_qkv_bias=False,
    use_bias=False,
    rms_norm_eps=1e-6,
    norm_head=True,
    max_position_embeddings=1024,
    rope_theta=600000.0,
    pad_token_id=0,
    eos_token_id=IM_END_ID,
    num_experts=4,
    num_shared_experts=1,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    moe_intermediate_size=32,
    first_k_dense_replace=0,  # as the real one; the reference crashes on dense layers
    multi_gate=True,
)
TALKER = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)


def _thinker_shapes(c: BailingMoeConfig) -> dict[str, tuple[int, ...]]:
    h, hd = c.hidden_size, c.head_dim
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * hd
    out = {"model.model.word_embeddings.weight": (c.vocab_size, h)}
    for i in range(c.num_hidden_layers):
        p = f"model.model.layers.{i}."
        out[p + "attention.query_key_value.weight"] = (qkv, h)
        out[p + "attention.dense.weight"] = (h, c.num_attention_heads * hd)
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        mlps = {"mlp.": c.intermediate_size}
        if i >= c.first_k_dense_replace:
            mlps = {f"mlp.experts.{e}.": c.moe_intermediate_size for e in range(c.num_experts)}
            mlps["mlp.shared_experts."] = c.moe_intermediate_size * c.num_shared_experts
            for gate in ("gate", "image_gate", "audio_gate"):
                out[f"{p}mlp.{gate}.weight"] = (c.num_experts, h)
        for m, inner in mlps.items():
            out[p + m + "gate_proj.weight"] = (inner, h)
            out[p + m + "up_proj.weight"] = (inner, h)
            out[p + m + "down_proj.weight"] = (h, inner)
    out["model.model.norm.weight"] = (h,)
    out["model.lm_head.weight"] = (c.vocab_size, h)
    return out


def draw_weights(shapes: dict[str, tuple[int, ...]], g: torch.Generator) -> dict[str, torch.Tensor]:
    """Random tiny weights for `shapes`, drawn in order from `g` (norms near 1)."""
    out = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            out[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif len(shape) >= 2:
            out[name] = 0.2 * torch.randn(shape, generator=g)
        else:
            out[name] = 0.1 * torch.randn(shape, generator=g)
    return out


def _vision_weights(hidden: int, mlp_depth: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """`vision.*` and `linear_proj.*`: norms N(1, 0.1), other vectors N(0, 0.1), matrices
    N(0, 0.2) scaled by 1/sqrt(fan-in / 64) so that 8192-wide inputs stay in range."""
    from omnistage.families.ming_omni.vision import MingImageEncoder

    with torch.device("meta"):
        model = MingImageEncoder(VISION, hidden, mlp_depth)
    out = {}
    for name, p in model.state_dict().items():
        if len(p.shape) == 1:
            base = 1.0 if ("norm" in name or "ln_q" in name) else 0.0
            out[name] = base + 0.1 * torch.randn(p.shape, generator=g)
        else:
            fan_in = p[0].numel()
            out[name] = 0.2 * min(1.0, (64 / fan_in) ** 0.5) * torch.randn(p.shape, generator=g)
    return out


def _audio_weights(hidden: int, mlp_depth: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """`audio.*` and `linear_proj_audio.*`, drawn as `_vision_weights` draws."""
    from omnistage.families.ming_omni.sanm import MingAudioEncoder

    with torch.device("meta"):
        model = MingAudioEncoder(AUDIO, hidden, mlp_depth)
    out = {}
    for name, p in model.state_dict().items():
        if len(p.shape) == 1:
            base = 1.0 if "norm" in name else 0.0
            out[name] = base + 0.1 * torch.randn(p.shape, generator=g)
        else:
            fan_in = p[0].numel()
            out[name] = 0.2 * min(1.0, (64 / fan_in) ** 0.5) * torch.randn(p.shape, generator=g)
    return out


def _write_cmvn(path: Path, g: torch.Generator) -> None:
    """A Kaldi nnet `am.mvn` (shift about minus the log mel level, scale about 1/4)."""
    dim = FRONTEND["n_mels"] * FRONTEND["lfr_m"]
    shift = (-12.0 + torch.randn(dim, generator=g)).tolist()
    scale = (0.25 + 0.05 * torch.randn(dim, generator=g)).tolist()
    rows = [f"<Nnet>\n<Splice> {dim} {dim}\n[ 0 ]\n"]
    for name, values in (("<AddShift>", shift), ("<Rescale>", scale)):
        text = " ".join(f"{v:.6f}" for v in values)
        rows.append(f"{name} {dim} {dim}\n<LearnRateCoef> 0 [ {text} ]\n")
    path.write_text("".join(rows) + "</Nnet>\n")


def _talker_shapes(decoder, thinker_hidden: int, vp: int) -> dict[str, tuple[int, ...]]:
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(decoder)
    out = {f"talker.model.{n}": tuple(p.shape) for n, p in model.state_dict().items()}
    h = decoder.hidden_size
    out["talker.thinker_to_talker_proj.weight"] = (h, thinker_hidden)
    out["talker.thinker_to_talker_proj.bias"] = (h,)
    out["talker.vp_head.weight"] = (h, vp, 1)
    out["talker.vp_head.bias"] = (h,)
    return out


def make_tiny_ming_omni(path: Path, seed: int = 0, dtype: torch.dtype = torch.float32) -> Path:
    """Write the seeded tiny checkpoint at `path` (float32 weights drawn, saved in `dtype`)."""
    from safetensors.torch import save_file
    from transformers import Qwen2Config

    from omnistage.families.ming_omni.vocoder_tiny import write_tiny_vocoder

    path = Path(path)
    (path / SPEAKERS_DIR).mkdir(parents=True, exist_ok=True)
    thinker_tok = byte_tokenizer(IMAGE_SPECIALS + AUDIO_SPECIALS)
    thinker_tok.chat_template = CHAT_TEMPLATE.replace("{{ m['content'] }}", CONTENT)
    talker_tok = byte_tokenizer(TALKER_SPECIALS)
    text_vocab = len(talker_tok)
    eos = talker_tok.convert_tokens_to_ids("<audio_eos>")
    llm = BailingMoeConfig(
        **THINKER,
        image_patch_token=thinker_tok.convert_tokens_to_ids("<imagePatch>"),
        architectures=["BailingMoeForCausalLM"],
    )
    talker_llm = Qwen2Config(**TALKER, vocab_size=text_vocab, eos_token_id=eos)
    talker = dict(
        qa_model_hidden_size=llm.hidden_size,
        vocab_size=text_vocab + AUDIO_VOCAB,
        text_vocab_size=text_vocab,
        audio_vocab_size=AUDIO_VOCAB,
        vp_feature_size=192,
    )
    config = BailingMMConfig(
        mlp_depth=2,
        llm_config=llm,
        vision_config=VISION,
        audio_config=AUDIO,
        talker_config=talker,
        architectures=["BailingMMNativeForConditionalGeneration"],
    )
    g = torch.Generator().manual_seed(seed)
    weights = draw_weights(_thinker_shapes(llm), g)
    resized = Qwen2Config(**{**talker_llm.to_dict(), "vocab_size": text_vocab + AUDIO_VOCAB})
    weights |= draw_weights(_talker_shapes(resized, llm.hidden_size, 192), g)
    keep = torch.zeros(llm.vocab_size, dtype=torch.bool)
    keep[3:259] = True  # byte tokens
    keep[IM_END_ID] = True
    weights["model.lm_head.weight"][~keep] = 0.0
    weights["talker.model.lm_head.weight"][:text_vocab][torch.arange(text_vocab) != eos] = 0.0
    save_file({k: v.to(dtype).contiguous() for k, v in weights.items()}, path / "model.safetensors")
    vision = _vision_weights(
        llm.hidden_size, config.mlp_depth, torch.Generator().manual_seed(seed + 1)
    )
    save_file({k: v.to(dtype).contiguous() for k, v in vision.items()}, path / "vision.safetensors")
    audio = _audio_weights(
        llm.hidden_size, config.mlp_depth, torch.Generator().manual_seed(seed + 2)
    )
    save_file({k: v.to(dtype).contiguous() for k, v in audio.items()}, path / "audio.safetensors")
    _write_cmvn(path / FRONTEND["cmvn_file"], torch.Generator().manual_seed(seed + 3))
    preprocessor = PREPROCESSOR | {"wav_frontend_args": FRONTEND}
    (path / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    config.save_pretrained(path)
    talker_llm.save_pretrained(path / "talker")
    for folder, tok in ((path, thinker_tok), (path / "talker", talker_tok)):
        tok.save_pretrained(folder)
        # The class any transformers release reads (the reference pins 4.45).
        settings_file = folder / "tokenizer_config.json"
        settings = json.loads(settings_file.read_text())
        settings["tokenizer_class"] = "PreTrainedTokenizerFast"
        settings_file.write_text(json.dumps(settings, indent=2))
    luna = torch.randn(1, 192, generator=g)
    torch.save(luna.to(dtype), path / SPEAKERS_DIR / "luna.pt")
    write_tiny_vocoder(path / "talker", seed)
    return path
