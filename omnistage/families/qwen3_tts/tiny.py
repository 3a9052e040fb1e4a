"""A tiny random-weight Qwen3-TTS (12 Hz) checkpoint in the real HF layout.

`config.json` (`model_type` qwen3_tts, `talker_config` with its
`code_predictor_config`, `speaker_encoder_config`), `generation_config.json`, a
byte-level tokenizer with the model's special tokens, `model.safetensors` with the
real weight names (`talker.model.*`, `talker.text_projection.*`,
`talker.codec_head.*`, `talker.code_predictor.*`), and the speech tokenizer under
`speech_tokenizer/` (`tiny_codec.write_tiny_speech_tokenizer`).

Ids follow the real model's layout at a smaller scale: text ids are the byte
tokenizer's (`<|im_start|>` 1, `<|im_end|>` 2, bytes 3-258, then the TTS tokens
and one-token role words, so the reference's `[3:-5]` slicing of the assistant
template holds); codec ids are the codebook (`TINY_CODEBOOK_SIZE` codes) and then
the control, speaker and language ids, all inside the top 1024 ids that the
talker never samples but `codec_eos`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

TEXT_SPECIALS = ["<tts_pad>", "<tts_text_bos>", "<tts_text_eod>"]
ROLE_TOKENS = ["assistant", "user"]
TEXT_IDS = {"tts_pad": 259, "tts_bos": 260, "tts_eos": 261}
TEXT_VOCAB_SIZE = 272
NUM_CODE_GROUPS = 16
SPEAKERS = {"vivian": 40, "ryan": 41, "uncle_fu": 42}
"""CustomVoice speakers -> codec ids (offsets above the codebook; `uncle_fu` speaks a
dialect, as on the Hub)."""
LANGUAGES = {"chinese": 50, "english": 51, "sichuan_dialect": 52}
CONTROL = {
    "codec_pad_id": 0,
    "codec_bos_id": 1,
    "codec_eos_token_id": 2,
    "codec_think_id": 3,
    "codec_nothink_id": 4,
    "codec_think_bos_id": 5,
    "codec_think_eos_id": 6,
}


def tiny_qwen3_tts_config(codebook_size: int, kind: str = "custom_voice") -> dict:
    """The config.json of the tiny checkpoint (`kind`: custom_voice, voice_design, base)."""
    first = codebook_size + 8  # control ids start past the codebook
    predictor = dict(
        vocab_size=codebook_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=1e-6,
        rope_theta=10000,
        num_code_groups=NUM_CODE_GROUPS,
    )
    talker = dict(
        code_predictor_config=predictor,
        vocab_size=first + 1024 - 8,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=12,
        rms_norm_eps=1e-6,
        rope_theta=10000,
        rope_scaling={"mrope_section": [2, 2, 2], "interleaved": True, "rope_type": "default"},
        num_code_groups=NUM_CODE_GROUPS,
        text_hidden_size=40,
        text_vocab_size=TEXT_VOCAB_SIZE,
        max_position_embeddings=4096,
        **{k: first + v for k, v in CONTROL.items()},
        spk_id={k: first + v for k, v in SPEAKERS.items()} if kind == "custom_voice" else {},
        spk_is_dialect=(
            {"vivian": False, "ryan": False, "uncle_fu": "sichuan_dialect"}
            if kind == "custom_voice"
            else {}
        ),
        codec_language_id={k: first + v for k, v in LANGUAGES.items()},
    )
    return dict(
        architectures=["Qwen3TTSForConditionalGeneration"],
        model_type="qwen3_tts",
        tokenizer_type="qwen3_tts_tokenizer_12hz",
        tts_model_size="1b7",
        tts_model_type=kind,
        talker_config=talker,
        speaker_encoder_config=dict(
            mel_dim=128,
            enc_dim=48,
            enc_channels=[16, 16, 16, 16, 48],
            enc_attention_channels=8,
            enc_res2net_scale=4,
            enc_se_channels=8,
        ),
        im_start_token_id=1,
        im_end_token_id=2,
        tts_pad_token_id=TEXT_IDS["tts_pad"],
        tts_bos_token_id=TEXT_IDS["tts_bos"],
        tts_eos_token_id=TEXT_IDS["tts_eos"],
        torch_dtype="float32",
    )


def talker_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every talker tensor of the checkpoint, by its real name, and its shape."""
    t = config["talker_config"]
    p = t["code_predictor_config"]
    shapes: dict[str, tuple[int, ...]] = {
        "talker.model.codec_embedding.weight": (t["vocab_size"], t["hidden_size"]),
        "talker.model.text_embedding.weight": (t["text_vocab_size"], t["text_hidden_size"]),
        "talker.model.norm.weight": (t["hidden_size"],),
        "talker.codec_head.weight": (t["vocab_size"], t["hidden_size"]),
        "talker.text_projection.linear_fc1.weight": (t["text_hidden_size"],) * 2,
        "talker.text_projection.linear_fc1.bias": (t["text_hidden_size"],),
        "talker.text_projection.linear_fc2.weight": (t["hidden_size"], t["text_hidden_size"]),
        "talker.text_projection.linear_fc2.bias": (t["hidden_size"],),
        "talker.code_predictor.model.norm.weight": (p["hidden_size"],),
    }
    shapes |= _decoder_shapes("talker.model.layers", t)
    shapes |= _decoder_shapes("talker.code_predictor.model.layers", p)
    for j in range(p["num_code_groups"] - 1):
        shapes[f"talker.code_predictor.model.codec_embedding.{j}.weight"] = (
            p["vocab_size"],
            t["hidden_size"],
        )
        shapes[f"talker.code_predictor.lm_head.{j}.weight"] = (p["vocab_size"], p["hidden_size"])
    if p["hidden_size"] != t["hidden_size"]:
        projection = "talker.code_predictor.small_to_mtp_projection"
        shapes[f"{projection}.weight"] = (p["hidden_size"], t["hidden_size"])
        shapes[f"{projection}.bias"] = (p["hidden_size"],)
    return shapes


def _decoder_shapes(prefix: str, c: dict) -> dict[str, tuple[int, ...]]:
    hidden, inter, d = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    shapes = {}
    for i in range(c["num_hidden_layers"]):
        at = f"{prefix}.{i}"
        shapes |= {
            f"{at}.self_attn.q_proj.weight": (q, hidden),
            f"{at}.self_attn.k_proj.weight": (kv, hidden),
            f"{at}.self_attn.v_proj.weight": (kv, hidden),
            f"{at}.self_attn.o_proj.weight": (hidden, q),
            f"{at}.self_attn.q_norm.weight": (d,),
            f"{at}.self_attn.k_norm.weight": (d,),
            f"{at}.mlp.gate_proj.weight": (inter, hidden),
            f"{at}.mlp.up_proj.weight": (inter, hidden),
            f"{at}.mlp.down_proj.weight": (hidden, inter),
            f"{at}.input_layernorm.weight": (hidden,),
            f"{at}.post_attention_layernorm.weight": (hidden,),
        }
    return shapes


def random_talker_weights(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights: norms N(1, 0.1), biases N(0, 0.1), matrices N(0, 0.2) (embeddings
    N(0, 1)), so that logits are well separated; the `codec_eos` row of the codec head is
    zero, so the talker does not end by itself before `max_tokens` (as the tiny
    Qwen3-Omni's)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in talker_shapes(config).items():
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("bias"):
            value = 0.1 * torch.randn(shape, generator=g)
        elif "embedding" in name:
            value = torch.randn(shape, generator=g)
        else:
            value = 0.2 * torch.randn(shape, generator=g)
        out[name] = value
    out["talker.codec_head.weight"][config["talker_config"]["codec_eos_token_id"]] = 0.0
    return out


def tiny_qwen3_tts_tokenizer():
    """The byte-level tokenizer with Qwen3-TTS's TTS tokens and one-token role words."""
    from omnistage.models.tiny_checkpoints import byte_tokenizer

    tok = byte_tokenizer(TEXT_SPECIALS)
    tok.backend_tokenizer.add_tokens(ROLE_TOKENS)
    for name, token in zip(TEXT_IDS, TEXT_SPECIALS, strict=True):
        if tok.convert_tokens_to_ids(token) != TEXT_IDS[name]:
            raise RuntimeError(f"tiny tokenizer: {token} is not id {TEXT_IDS[name]}")
    return tok


def make_tiny_qwen3_tts(path: str | Path, seed: int = 0, kind: str = "custom_voice") -> Path:
    """Write the tiny checkpoint to `path` (created) and return it."""
    from safetensors.torch import save_file

    from omnistage.families.qwen3_tts.tiny_codec import (
        TINY_CODEBOOK_SIZE,
        write_tiny_speech_tokenizer,
    )

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = tiny_qwen3_tts_config(TINY_CODEBOOK_SIZE, kind)
    weights = random_talker_weights(config, seed)
    if kind == "base":
        from omnistage.families.qwen3_tts.tiny_speaker import random_speaker_encoder_state

        weights |= random_speaker_encoder_state(config["speaker_encoder_config"], seed)
    save_file({k: v.contiguous() for k, v in weights.items()}, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps(config, indent=2))
    generation = dict(
        do_sample=True,
        top_k=50,
        top_p=1.0,
        temperature=0.9,
        repetition_penalty=1.05,
        subtalker_dosample=True,
        subtalker_top_k=50,
        subtalker_top_p=1.0,
        subtalker_temperature=0.9,
        max_new_tokens=2048,
    )
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))
    tiny_qwen3_tts_tokenizer().save_pretrained(path)
    write_tiny_speech_tokenizer(path, seed)
    return path
