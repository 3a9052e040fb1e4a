"""What `AutoProcessor` reads from the tiny Qwen3-Omni checkpoint, and the thinker's token ids.

A byte-level tokenizer that knows the model's special tokens, a chat template that
renders audio / image / video items, and the feature-extractor / image-processor /
video-processor configs. The image and video processors need Pillow / torchvision
to be *instantiated*; their configs are plain JSON so that the files do not need
them.

Thinker token ids follow the real model's layout at a smaller scale
(`THINKER_VOCAB_SIZE`): `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` (0-2), the
256 byte tokens (3-258), the multimodal / TTS special tokens (`SPECIAL_TOKENS`,
from 259), then the role words `system`, `user`, `assistant` as single
(non-special) tokens, so that `<|im_start|>` is followed by exactly one role token,
as in Qwen's tokenizer (the talker's prompt builder relies on that).
"""

from __future__ import annotations

from omnistage.models.tiny_checkpoints import (
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
