"""What `AutoProcessor` reads from the tiny Qwen2.5-Omni checkpoint, and the thinker's token ids.

A byte-level tokenizer that knows the model's special tokens, a chat template that
renders audio / image / video items, and the processor config (plain JSON;
instantiating the image / video processors needs Pillow / torchvision, the files
do not).

Thinker token ids follow the real model's layout at a smaller scale
(`THINKER_VOCAB_SIZE`): `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` (0-2), the
256 byte tokens (3-258), the multimodal tokens and the talker's text-side tokens
(`SPECIAL_TOKENS`, from 259; real: `<|AUDIO|>` 151646, `<|audio_bos|>` 151647,
`<|IMAGE|>` 151655, `tts_text_pad` 151859, `tts_text_start` 151860,
`tts_text_end` 151861), the role words `system`, `user`, `assistant` as single
(non-special) tokens, then the two speakers' text-side `bos_token` ids
(`SPEAKER_BOS`; real Ethan 151870, Chelsie 151872, as vllm-omni hard-codes them),
embedding rows the tiny tokenizer does not name. The names of the three TTS tokens
are ours (Qwen3-Omni's); transformers' Qwen2.5-Omni code refers to them only by id
(`talker_config.tts_text_{start,end,pad}_token_id`).
"""

from __future__ import annotations

from omnistage.models.tiny_checkpoints import (
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
