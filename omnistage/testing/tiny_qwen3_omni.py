"""A tiny random-weight Qwen3-Omni (`Qwen3OmniMoeForConditionalGeneration`) checkpoint.

The checkpoint has the real HF layout: one `config.json` with `thinker_config`,
`talker_config` and `code2wav_config`; safetensors with the real weight names
(`thinker.*`, `talker.*`, `code2wav.*`, MoE experts stored per expert as on the
Hub, written by `save_pretrained`); a `generation_config.json`; and the files
`AutoProcessor` (`Qwen3OmniMoeProcessor`) reads: a byte-level tokenizer that
knows the model's special tokens, a chat template that renders audio / image /
video items, and the feature-extractor / image-processor / video-processor
configs. The image and video processors need Pillow / torchvision to be
*instantiated*; their configs are written as plain JSON so that the files do
not need them.

Token ids follow the real model's layout at a smaller scale:

- thinker vocab (`THINKER_VOCAB_SIZE`): `<|endoftext|>`, `<|im_start|>`,
  `<|im_end|>` (0-2), the 256 byte tokens (3-258), the multimodal / TTS special
  tokens (`SPECIAL_TOKENS`, from 259), then the role words `system`, `user`,
  `assistant` as single (non-special) tokens, so that `<|im_start|>` is followed
  by exactly one role token, as in Qwen's tokenizer (the talker's prompt
  builder relies on that).
- talker vocab = `CODEBOOK_SIZE + 1024`: codes `0..CODEBOOK_SIZE-1`, codec
  control tokens above them (`CODEC_IDS`, at the real offsets above the
  codebook, e.g. `codec_pad = codebook + 100`). `generate` suppresses the top
  1024 ids of the talker vocab except `codec_eos`, so this size leaves exactly
  the codes and `codec_eos` sampleable, as in the real model (2048 + 1024).
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

# Thinker-side special tokens, in the order of Qwen's tokenizer (ids 259...).
SPECIAL_TOKENS = [
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
]
ROLE_TOKENS = ["system", "user", "assistant"]
FIRST_EXTRA_ID = 259  # 3 base specials + 256 bytes (see tiny_models.byte_tokenizer)
TOKEN_IDS = {tok: FIRST_EXTRA_ID + i for i, tok in enumerate(SPECIAL_TOKENS + ROLE_TOKENS)}
THINKER_VOCAB_SIZE = 384  # > 259 + 15 used ids; padded like real vocabularies

IM_START_ID, IM_END_ID, ENDOFTEXT_ID = 1, 2, 0
# Named tokens the processor reads from the tokenizer (`tokenizer.audio_token`, ...).
PROCESSOR_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_token": "<|audio_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}

HIDDEN = (
    64  # thinker hidden size (= audio/vision encoder output size = talker's thinker_hidden_size)
)
TALKER_HIDDEN = 32
NUM_CODE_GROUPS = 4  # codebooks per frame (real: 16)
CODEBOOK_SIZE = 32  # (real: 2048)
TALKER_VOCAB_SIZE = CODEBOOK_SIZE + 1024
# Codec control ids at the real model's offsets above the codebook (real: 2148, 2149, ...).
CODEC_IDS = {
    "codec_pad_id": CODEBOOK_SIZE + 100,
    "codec_bos_id": CODEBOOK_SIZE + 101,
    "codec_eos_token_id": CODEBOOK_SIZE + 102,
    "codec_nothink_id": CODEBOOK_SIZE + 107,
    "codec_think_bos_id": CODEBOOK_SIZE + 108,
    "codec_think_eos_id": CODEBOOK_SIZE + 109,
}
SPEAKER_IDS = {
    "chelsie": CODEBOOK_SIZE + 253,
    "ethan": CODEBOOK_SIZE + 254,
    "aiden": CODEBOOK_SIZE + 255,
}
ACCEPT_HIDDEN_LAYER = 1  # hidden_states[1] = output of thinker layer 0 (real: 24 of 48)
SAMPLE_RATE = 24000  # code2wav output rate of the real model (not stored in its config)

CHAT_TEMPLATE = omni_chat_template(
    "<|audio_start|><|audio_pad|><|audio_end|>",
    "<|vision_start|><|image_pad|><|vision_end|>",
    "<|vision_start|><|video_pad|><|vision_end|>",
)

# Sub-processor configs (the real model's values, image patch size = the vision encoder's).
FEATURE_EXTRACTOR_CONFIG = dict(WHISPER_FEATURE_EXTRACTOR_CONFIG)
IMAGE_PROCESSOR_CONFIG = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "do_resize": True,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_convert_rgb": True,
    "size": {"shortest_edge": 32 * 32, "longest_edge": 256 * 32 * 32},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
}
VIDEO_PROCESSOR_CONFIG = {
    **IMAGE_PROCESSOR_CONFIG,
    "video_processor_type": "Qwen2VLVideoProcessor",
}
del VIDEO_PROCESSOR_CONFIG["image_processor_type"]


MROPE = {
    "rope_type": "default",
    "rope_theta": 1000000.0,
    "mrope_section": [4, 2, 2],  # sums to head_dim / 2 = 8 (real: [24, 20, 20] for 128)
    "interleaved": True,
    "mrope_interleaved": True,
}


def _media_ids() -> dict[str, int]:
    """Audio / image / video token ids and timing both the thinker and the talker read."""
    ids = TOKEN_IDS
    return dict(
        audio_token_id=ids["<|audio_pad|>"],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        audio_start_token_id=ids["<|audio_start|>"],
        audio_end_token_id=ids["<|audio_end|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        position_id_per_seconds=13,
        seconds_per_chunk=2,
    )


def _thinker_config() -> dict:
    thinker_text = dict(
        vocab_size=THINKER_VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_parameters=dict(MROPE),
        tie_word_embeddings=False,
    )
    audio = dict(
        num_mel_bins=128,
        encoder_layers=1,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        d_model=32,
        output_dim=HIDDEN,
        downsample_hidden_size=8,
        n_window=50,
        n_window_infer=800,
        max_source_positions=1500,
    )
    vision = dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        in_channels=3,
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=HIDDEN,
        num_position_embeddings=64,  # a square: 8 x 8 learned position grid
        deepstack_visual_indexes=[0],
    )
    return dict(
        text_config=thinker_text,
        audio_config=audio,
        vision_config=vision,
        vision_end_token_id=TOKEN_IDS["<|vision_end|>"],
        user_token_id=TOKEN_IDS["user"],
        **_media_ids(),
    )


def _talker_config() -> dict:
    talker_text = dict(
        vocab_size=TALKER_VOCAB_SIZE,
        hidden_size=TALKER_HIDDEN,
        intermediate_size=64,  # also the width of text_projection / hidden_projection
        moe_intermediate_size=16,
        shared_expert_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_parameters=dict(MROPE),
    )
    code_predictor = dict(
        vocab_size=CODEBOOK_SIZE,
        hidden_size=TALKER_HIDDEN,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_code_groups=NUM_CODE_GROUPS,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    return dict(
        text_config=talker_text,
        code_predictor_config=code_predictor,
        num_code_groups=NUM_CODE_GROUPS,
        thinker_hidden_size=HIDDEN,
        accept_hidden_layer=ACCEPT_HIDDEN_LAYER,
        speaker_id=dict(SPEAKER_IDS),
        spatial_merge_size=2,
        **_media_ids(),
        **CODEC_IDS,
    )


def _code2wav_config() -> dict:
    return dict(
        codebook_size=CODEBOOK_SIZE,
        num_quantizers=NUM_CODE_GROUPS,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        sliding_window=8,  # frames (real: 72)
        max_position_embeddings=8000,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        decoder_dim=32,
        upsample_rates=[2, 2, 2, 2],  # real: [8, 5, 4, 3]
        upsampling_ratios=[2, 2],  # real: [2, 2]; samples per code frame = product = 64 (real 1920)
    )


def tiny_qwen3_omni_config():
    """The `Qwen3OmniMoeConfig` of the tiny checkpoint (all sizes as small as the code allows)."""
    from transformers import Qwen3OmniMoeConfig

    ids = TOKEN_IDS
    return Qwen3OmniMoeConfig(
        thinker_config=_thinker_config(),
        talker_config=_talker_config(),
        code2wav_config=_code2wav_config(),
        enable_audio_output=True,
        im_start_token_id=IM_START_ID,
        im_end_token_id=IM_END_ID,
        tts_pad_token_id=ids["<tts_pad>"],
        tts_bos_token_id=ids["<tts_text_bos>"],
        tts_eos_token_id=ids["<tts_text_eod>"],
        system_token_id=ids["system"],
        user_token_id=ids["user"],
        assistant_token_id=ids["assistant"],
    )


def tiny_qwen3_omni_tokenizer():
    """The byte-level tokenizer with Qwen3-Omni's special tokens and one-token role words."""
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
    assert len(tok) <= THINKER_VOCAB_SIZE
    return tok


def _randomize(model: nn.Module, generator: torch.Generator) -> None:
    """Seeded weights large enough that logits are well separated (as in tiny_models).

    Decoder matrices get N(0, 0.2) like tiny_models; encoder and vocoder
    matrices N(0, min(0.2, fan_in**-0.5)) so their activations stay O(1); norm
    weights N(1, 0.1); other vectors N(0, 0.1). Some output rows are then zeroed
    so that the random model behaves like a usable one (a zero row gives logit 0,
    below the maximum of the other random logits with overwhelming probability):

    - thinker `lm_head` rows of every id except the 256 byte tokens and
      `<|im_end|>`: the thinker writes byte text and may end it, never unused
      vocabulary rows nor multimodal / TTS control tokens.
    - talker `codec_head` row of `codec_eos`: the talker never ends by itself, so
      it always writes `talker_max_new_tokens - 1` frames (an immediate EOS also
      crashes transformers' `generate`, which stacks an empty list of codes).

    The vocoder's last convolution is scaled by 0.1 so that the waveform mostly
    stays inside code2wav's final clamp to [-1, 1] (a clipped signal would hide
    differences in parity tests), and the talker's codec embeddings are scaled up
    (x3) and its attention / MLP output projections down (x0.5) so that its
    first-codebook codes vary from frame to frame.
    """
    with torch.no_grad():
        for mod_name, module in model.named_modules():
            is_norm = isinstance(module, nn.LayerNorm) or type(module).__name__.endswith("RMSNorm")
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
        model.talker.codec_head.weight[CODEC_IDS["codec_eos_token_id"]] = 0.0
        for p in model.code2wav.decoder[-1].parameters():
            p.mul_(0.1)
        # Talker: larger codec embeddings and smaller residual-branch outputs, so that each
        # step's input (the previous frame's codes + one text token) rather than the shared
        # prompt decides the next code; otherwise one code wins at nearly every step.
        for emb in [
            model.talker.model.codec_embedding,
            *model.talker.code_predictor.model.codec_embedding,
        ]:
            emb.weight.mul_(3.0)
        for name, p in model.talker.model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                p.mul_(0.5)


def make_tiny_qwen3_omni(path: Path, seed: int = 0, dtype=torch.float32) -> Path:
    """Save a seeded tiny `Qwen3OmniMoeForConditionalGeneration` checkpoint with its processor files."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = tiny_qwen3_omni_config()
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG alone
        torch.manual_seed(seed)
        model = Qwen3OmniMoeForConditionalGeneration(config)
    # Drawn in float32 whatever `dtype` is: a float64 checkpoint is the float32 one upcast.
    _randomize(model, torch.Generator().manual_seed(seed))
    model.to(dtype).save_pretrained(path)

    tok = tiny_qwen3_omni_tokenizer()
    tok.save_pretrained(path)
    processor_config = {
        "processor_class": "Qwen3OmniMoeProcessor",
        "feature_extractor": FEATURE_EXTRACTOR_CONFIG,
        "image_processor": IMAGE_PROCESSOR_CONFIG,
        "video_processor": VIDEO_PROCESSOR_CONFIG,
    }
    (path / "processor_config.json").write_text(json.dumps(processor_config, indent=2) + "\n")
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return path


def tiny_qwen3_omni_deploy(
    path: Path, *, dtype: str = "float64", async_scheduling: bool = True, stream: bool = True
):
    """The packaged demo-omni deploy serving the checkpoint at `path`; with `stream=False`
    every edge carries a whole payload instead of stream chunks."""
    import dataclasses

    from omnistage.pipeline.deploy import load_deploy, packaged_deploy_path

    spec = load_deploy(packaged_deploy_path("demo-omni")).with_model(str(path))
    spec = spec.with_engine_args({"dtype": dtype, "async_scheduling": async_scheduling})
    if not stream:
        edges = tuple(dataclasses.replace(e, transfer="payload") for e in spec.edges)
        spec = dataclasses.replace(spec, edges=edges)
    return spec
