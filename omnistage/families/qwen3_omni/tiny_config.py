"""The `Qwen3OmniMoeConfig` of the tiny Qwen3-Omni: sizes, talker codec ids, speakers.

All sizes are as small as the code allows. The talker vocab is
`CODEBOOK_SIZE + 1024`: codes `0..CODEBOOK_SIZE-1`, codec control tokens above
them (`CODEC_IDS`, at the real offsets above the codebook, e.g. `codec_pad =
codebook + 100`). `generate` suppresses the top 1024 ids of the talker vocab
except `codec_eos`, so this size leaves exactly the codes and `codec_eos`
sampleable, as in the real model (2048 + 1024). Thinker token ids come from
`tiny_qwen3_omni_processor`.
"""

from __future__ import annotations

from omnistage.families.qwen3_omni.tiny_processor import (
    IM_END_ID,
    IM_START_ID,
    THINKER_VOCAB_SIZE,
    TOKEN_IDS,
)

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
