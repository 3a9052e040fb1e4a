"""A tiny random-weight Qwen2.5-Omni (`Qwen2_5OmniForConditionalGeneration`) checkpoint.

The checkpoint has the real HF layout: one `config.json` with `thinker_config`
(text, audio and vision sub-configs), `talker_config` and `token2wav_config`
(`dit_config`, `bigvgan_config`); safetensors with the real weight names
(`thinker.{model,lm_head,audio_tower,visual}.*`,
`talker.{thinker_to_talker_proj,model,codec_head}.*`,
`token2wav.{code2wav_dit_model,code2wav_bigvgan_model}.*`, written by
`save_pretrained`); a `generation_config.json`; the speaker file `spk_dict.pt`
that `Qwen2_5OmniForConditionalGeneration.from_pretrained` requires
(`torch.load(weights_only=True)` of `{name: {"bos_token": int, "cond": [1, enc_emb_dim],
"ref_mel": [1, frames, mel_dim]}}` for "Chelsie" and "Ethan"); and the files
`AutoProcessor` (`Qwen2_5OmniProcessor`) reads: a byte-level tokenizer that knows
the model's special tokens, a chat template that renders audio / image / video
items, and the processor config (written as plain JSON; instantiating the
image / video processors needs Pillow / torchvision, the files do not).

Token ids follow the real model's layout at a smaller scale:

- thinker vocab (`THINKER_VOCAB_SIZE`): `<|endoftext|>`, `<|im_start|>`,
  `<|im_end|>` (0-2), the 256 byte tokens (3-258), the multimodal tokens and the
  talker's text-side tokens (`SPECIAL_TOKENS`, from 259; real: `<|AUDIO|>` 151646,
  `<|audio_bos|>` 151647, `<|IMAGE|>` 151655, `tts_text_pad` 151859,
  `tts_text_start` 151860, `tts_text_end` 151861), the role words `system`,
  `user`, `assistant` as single (non-special) tokens, then the two speakers'
  text-side `bos_token` ids (`SPEAKER_BOS`; real Ethan 151870, Chelsie 151872, as
  vllm-omni hard-codes them), embedding rows the tiny tokenizer does not name.
  The names of the three TTS tokens are ours (Qwen3-Omni's); transformers'
  Qwen2.5-Omni code refers to them only by id
  (`talker_config.tts_text_{start,end,pad}_token_id`).
  All of them are below the talker vocab size, so transformers' config checks
  (which compare these thinker ids with the *talker's* vocab, see
  `Qwen2_5OmniTalkerConfig`) stay quiet.
- talker vocab (`TALKER_VOCAB_SIZE`) = `CODEBOOK_SIZE + 256`: codes
  `0..CODEBOOK_SIZE-1`, codec control ids above them at the real offsets
  (`CODEC_IDS`: real pad 8292 = 8192 + 100, start 8293, end 8294, mask 8296;
  real vocab 8448 = 8192 + 256). The DiT's code table has `num_embeds + 1` rows
  (`DIT_NUM_EMBEDS = CODEBOOK_SIZE + 1`, real 8193), so it knows every code.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from omnistage.testing.tiny_models import (
    WHISPER_FEATURE_EXTRACTOR_CONFIG,
    byte_tokenizer,
    omni_chat_template,
)

# Thinker-side special tokens (ids 259...).
SPECIAL_TOKENS = [
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
]
ROLE_TOKENS = ["system", "user", "assistant"]
FIRST_EXTRA_ID = 259  # 3 base specials + 256 bytes (see tiny_models.byte_tokenizer)
TOKEN_IDS = {tok: FIRST_EXTRA_ID + i for i, tok in enumerate(SPECIAL_TOKENS + ROLE_TOKENS)}
# Text-side speaker tokens (`spk_dict.pt` "bos_token"): embedding rows only, like the real ones.
SPEAKER_BOS = {
    "Ethan": FIRST_EXTRA_ID + len(TOKEN_IDS),
    "Chelsie": FIRST_EXTRA_ID + len(TOKEN_IDS) + 1,
}
THINKER_VOCAB_SIZE = 384  # > 259 + 16 used ids; padded like real vocabularies
IM_START_ID, IM_END_ID, ENDOFTEXT_ID = 1, 2, 0
TTS_TEXT_IDS = {
    "tts_text_start_token_id": TOKEN_IDS["<tts_text_bos>"],
    "tts_text_end_token_id": TOKEN_IDS["<tts_text_eod>"],
    "tts_text_pad_token_id": TOKEN_IDS["<tts_pad>"],
}
# Named tokens the processor reads from the tokenizer (`tokenizer.audio_token`, ...).
PROCESSOR_TOKENS = {
    "image_token": "<|IMAGE|>",
    "video_token": "<|VIDEO|>",
    "audio_token": "<|AUDIO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}

HIDDEN = 64  # thinker hidden size (= audio/vision encoder output = talker embedding_size)
TALKER_HIDDEN = 32  # real: 896 (thinker 3584): the talker is narrower than its input
CODEBOOK_SIZE = 64  # real: 8192
TALKER_VOCAB_SIZE = CODEBOOK_SIZE + 256  # real: 8448
DIT_NUM_EMBEDS = CODEBOOK_SIZE + 1  # real: 8193
CODEC_IDS = {
    "tts_codec_pad_token_id": CODEBOOK_SIZE + 100,
    "tts_codec_start_token_id": CODEBOOK_SIZE + 101,
    "tts_codec_end_token_id": CODEBOOK_SIZE + 102,
    "tts_codec_mask_token_id": CODEBOOK_SIZE + 104,
}
# `generate(talker_eos_token_id=...)` defaults to the real [8292, 8294] = [codec_pad, codec_end].
TALKER_EOS_IDS = [CODEC_IDS["tts_codec_pad_token_id"], CODEC_IDS["tts_codec_end_token_id"]]
SPEAKERS = ("Chelsie", "Ethan")  # Chelsie is `generate`'s default
SPEAKER_COND_DIM = 16  # dit_config.enc_emb_dim (real 192)
MEL_DIM = 80
REF_MEL_FRAMES = 40
SAMPLE_RATE = 24000  # of the real model; not stored in its config
SAMPLES_PER_CODE = 480  # dit repeats (2) x prod(bigvgan upsample_rates) (240), as the real model

CHAT_TEMPLATE = omni_chat_template(
    "<|audio_bos|><|AUDIO|><|audio_eos|>",
    "<|vision_bos|><|IMAGE|><|vision_eos|>",
    "<|vision_bos|><|VIDEO|><|vision_eos|>",
)

# Sub-processor configs (the real model's values; image patch size = the vision encoder's).
FEATURE_EXTRACTOR_CONFIG = dict(WHISPER_FEATURE_EXTRACTOR_CONFIG)
IMAGE_PROCESSOR_CONFIG = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "do_resize": True,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "do_convert_rgb": True,
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
}
VIDEO_PROCESSOR_CONFIG = {
    **IMAGE_PROCESSOR_CONFIG,
    "video_processor_type": "Qwen2VLVideoProcessor",
}
del VIDEO_PROCESSOR_CONFIG["image_processor_type"]

ROPE = {
    "rope_type": "default",
    "rope_theta": 1000000.0,
    "mrope_section": [2, 3, 3],  # sums to head_dim / 2 = 8 (real: [16, 24, 24] for 128)
}


def _media_ids() -> dict[str, int]:
    """Audio / image / video token ids and timing both the thinker and the talker read."""
    ids = TOKEN_IDS
    return dict(
        audio_token_index=ids["<|AUDIO|>"],
        image_token_index=ids["<|IMAGE|>"],
        video_token_index=ids["<|VIDEO|>"],
        audio_start_token_id=ids["<|audio_bos|>"],
        audio_end_token_id=ids["<|audio_eos|>"],
        vision_start_token_id=ids["<|vision_bos|>"],
        vision_end_token_id=ids["<|vision_eos|>"],
        position_id_per_seconds=25,
        seconds_per_chunk=2,
    )


def _thinker_config() -> dict:
    text = dict(
        vocab_size=THINKER_VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # head_dim = 64 / 4 = 16
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_parameters=dict(ROPE),
        tie_word_embeddings=False,  # the text config's default is True; the real one sets False
        bos_token_id=ENDOFTEXT_ID,
        eos_token_id=IM_END_ID,
        pad_token_id=ENDOFTEXT_ID,
    )
    audio = dict(
        num_mel_bins=128,
        encoder_layers=1,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        d_model=32,
        output_dim=HIDDEN,
        n_window=100,
        max_source_positions=1500,
    )
    vision = dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        in_channels=3,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=112,
        out_hidden_size=HIDDEN,
        fullatt_block_indexes=[1],
    )
    return dict(
        text_config=text,
        audio_config=audio,
        vision_config=vision,
        user_token_id=TOKEN_IDS["user"],
        **_media_ids(),
    )


def _talker_config() -> dict:
    return dict(
        vocab_size=TALKER_VOCAB_SIZE,
        embedding_size=HIDDEN,
        hidden_size=TALKER_HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_parameters=dict(ROPE),
        spatial_merge_size=2,
        **_media_ids(),
        **TTS_TEXT_IDS,
        **CODEC_IDS,
    )


def _token2wav_config() -> dict:
    dit = dict(
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        head_dim=16,
        ff_mult=2,
        emb_dim=16,
        block_size=8,  # mel frames (real 24)
        look_ahead_layers=[1],  # real [10] of 22
        look_backward_layers=[0, 2],  # real [0, 20]
        repeats=2,
        num_embeds=DIT_NUM_EMBEDS,
        mel_dim=MEL_DIM,
        enc_emb_dim=SPEAKER_COND_DIM,
        enc_dim=16,
        enc_channels=[32, 32, 32, 32, 96],  # last = 3 x 32: the SE-Res2Net outputs concatenated
        enc_kernel_sizes=[5, 3, 3, 3, 1],
        enc_dilations=[1, 2, 3, 4, 1],
        enc_attention_channels=16,
        enc_res2net_scale=2,
        enc_se_channels=16,
    )
    bigvgan = dict(
        mel_dim=MEL_DIM,
        upsample_initial_channel=128,  # 128 / 2**6 = 2 channels at the end (real 1536 -> 24)
        resblock_kernel_sizes=[3, 7],  # real [3, 7, 11]
        resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]],
        upsample_rates=[5, 3, 2, 2, 2, 2],  # the real rates: 240 samples per mel frame
        upsample_kernel_sizes=[11, 7, 4, 4, 4, 4],
    )
    return dict(dit_config=dit, bigvgan_config=bigvgan)


def tiny_qwen25_omni_config():
    """The `Qwen2_5OmniConfig` of the tiny checkpoint (all sizes as small as the code allows)."""
    from transformers import Qwen2_5OmniConfig

    return Qwen2_5OmniConfig(
        thinker_config=_thinker_config(),
        talker_config=_talker_config(),
        token2wav_config=_token2wav_config(),
        enable_audio_output=True,
    )


def tiny_qwen25_omni_tokenizer():
    """The byte-level tokenizer with Qwen2.5-Omni's special tokens and one-token role words."""
    from transformers import PreTrainedTokenizerFast

    backend = byte_tokenizer(SPECIAL_TOKENS).backend_tokenizer
    backend.add_tokens(ROLE_TOKENS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        extra_special_tokens=dict(PROCESSOR_TOKENS),
    )
    tok.chat_template = CHAT_TEMPLATE
    for token, token_id in TOKEN_IDS.items():
        assert tok.convert_tokens_to_ids(token) == token_id, (token, token_id)
    assert len(tok) == min(SPEAKER_BOS.values())
    return tok


def _randomize(model: nn.Module, generator: torch.Generator) -> None:
    """Seeded weights large enough that logits are well separated (as in tiny_models).

    Decoder matrices (thinker text model, talker) get N(0, 0.2) like tiny_models;
    encoder, DiT and vocoder matrices N(0, min(0.2, fan_in**-0.5)) so their
    activations stay O(1); norm weights (RMSNorm, LayerNorm, BatchNorm) N(1, 0.1);
    other vectors N(0, 0.1). Then, so that the random model behaves like a usable one
    (a zero row gives logit 0, below the maximum of the other random logits with
    overwhelming probability):

    - thinker `lm_head` rows of every id except the 256 byte tokens and
      `<|im_end|>` are zeroed: the thinker writes byte text and may end it.
    - talker `codec_head` rows of every id from `CODEBOOK_SIZE` up (the codec
      control ids, the end ids `TALKER_EOS_IDS` among them) are zeroed: the talker
      writes only codes the DiT knows and never ends by itself, so it always
      writes `talker_max_new_tokens` codes.
    - the talker's codec embeddings are scaled up (x3) and its attention / MLP
      output projections down (x0.5), so that each step's input (the last code)
      rather than the shared prompt decides the next code and codes vary.
    - BigVGAN's last convolution is scaled by 0.1 so that the waveform stays
      mostly inside the final clamp to [-1, 1] (a clipped signal would hide
      differences in parity tests).
    """
    with torch.no_grad():
        for mod_name, module in model.named_modules():
            is_norm = isinstance(module, (nn.LayerNorm, nn.BatchNorm1d)) or type(
                module
            ).__name__.endswith("RMSNorm")
            for name, p in module.named_parameters(recurse=False):
                full = f"{mod_name}.{name}"
                if is_norm and name == "weight":
                    values = 1.0 + 0.1 * torch.randn(p.shape, generator=generator)
                elif p.dim() >= 2:
                    if full.startswith(
                        ("thinker.model.language_model", "thinker.lm_head", "talker")
                    ):
                        std = 0.2
                    else:
                        std = min(0.2, p[0].numel() ** -0.5)
                    values = std * torch.randn(p.shape, generator=generator)
                else:
                    values = 0.1 * torch.randn(p.shape, generator=generator)
                p.copy_(values)
        keep = torch.zeros(THINKER_VOCAB_SIZE, dtype=torch.bool)
        keep[3:259] = True  # byte tokens
        keep[IM_END_ID] = True
        model.thinker.lm_head.weight[~keep] = 0.0
        model.talker.codec_head.weight[CODEBOOK_SIZE:] = 0.0
        model.talker.model.embed_tokens.weight.mul_(3.0)
        for name, p in model.talker.model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(0.5)
        model.token2wav.code2wav_bigvgan_model.conv_post.weight.mul_(0.1)


def speaker_dict(generator: torch.Generator) -> dict[str, dict]:
    """`spk_dict.pt`'s content: per speaker its text-side bos token and DiT conditioning."""
    return {
        name: {
            "bos_token": SPEAKER_BOS[name],
            "cond": torch.randn(1, SPEAKER_COND_DIM, generator=generator),
            "ref_mel": torch.randn(1, REF_MEL_FRAMES, MEL_DIM, generator=generator) - 4.0,
        }
        for name in SPEAKERS
    }


def make_tiny_qwen25_omni(path: Path, dtype=torch.float32, seed: int = 0) -> Path:
    """Save a seeded tiny `Qwen2_5OmniForConditionalGeneration` checkpoint with its speaker
    file and processor files. All weights are drawn in float32 (a float64 checkpoint is the
    float32 one upcast); the token2wav weights are saved in float32 whatever `dtype` is, as
    transformers keeps that part in float32 (`enable_talker` calls `token2wav.float()`)."""
    from transformers import GenerationConfig, Qwen2_5OmniForConditionalGeneration

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = tiny_qwen25_omni_config()
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG alone
        torch.manual_seed(seed)
        model = Qwen2_5OmniForConditionalGeneration(config)
    generator = torch.Generator().manual_seed(seed)
    _randomize(model, generator)
    model.to(dtype)
    model.token2wav.float()
    model.generation_config = GenerationConfig(
        bos_token_id=ENDOFTEXT_ID, eos_token_id=IM_END_ID, pad_token_id=ENDOFTEXT_ID
    )
    model.save_pretrained(path)
    torch.save(speaker_dict(generator), path / "spk_dict.pt")

    tok = tiny_qwen25_omni_tokenizer()
    tok.save_pretrained(path)
    processor_config = {
        "processor_class": "Qwen2_5OmniProcessor",
        "feature_extractor": FEATURE_EXTRACTOR_CONFIG,
        "image_processor": IMAGE_PROCESSOR_CONFIG,
        "video_processor": VIDEO_PROCESSOR_CONFIG,
    }
    (path / "processor_config.json").write_text(json.dumps(processor_config, indent=2) + "\n")
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return path
