"""The `Qwen2_5OmniConfig` of the tiny Qwen2.5-Omni: sizes, talker codec ids, speakers.

All sizes are as small as the code allows. The talker vocab (`TALKER_VOCAB_SIZE`)
is `CODEBOOK_SIZE + 256`: codes `0..CODEBOOK_SIZE-1`, codec control ids above
them at the real offsets (`CODEC_IDS`: real pad 8292 = 8192 + 100, start 8293, end
8294, mask 8296; real vocab 8448 = 8192 + 256). The DiT's code table has
`num_embeds + 1` rows (`DIT_NUM_EMBEDS = CODEBOOK_SIZE + 1`, real 8193), so it
knows every code. The thinker token ids (`tiny_qwen25_omni_processor`) are all
below the talker vocab size, so transformers' config checks (which compare these
thinker ids with the *talker's* vocab, see `Qwen2_5OmniTalkerConfig`) stay quiet.
"""

from __future__ import annotations

from omnistage.families.qwen25_omni.tiny_processor import (
    ENDOFTEXT_ID,
    IM_END_ID,
    THINKER_VOCAB_SIZE,
    TOKEN_IDS,
)

TTS_TEXT_IDS = {
    "tts_text_start_token_id": TOKEN_IDS["<tts_text_bos>"],
    "tts_text_end_token_id": TOKEN_IDS["<tts_text_eod>"],
    "tts_text_pad_token_id": TOKEN_IDS["<tts_pad>"],
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
