"""Audio and image input for the Qwen2.5-Omni thinker, as transformers 5.23 prepares it.

`Qwen25OmniInputEncoder` turns a rendered chat prompt with one placeholder per
media item (`<|audio_bos|><|AUDIO|><|audio_eos|>`,
`<|vision_bos|><|IMAGE|><|vision_eos|>`, in order, as the model's chat template
renders them) plus the media into an `EncodedPrompt` for the thinker decoder:

- `prompt_token_ids`: the prompt with each `<|AUDIO|>` / `<|IMAGE|>` repeated to its
  item's token count, as `Qwen2_5OmniProcessor` expands it. Audio: the feature
  extractor pads every clip to `n_samples` (`padding="max_length"`, and truncates
  longer clips there: 300 s in the released processor config), the clip's valid mel
  frames `f` give `((f - 1) // 2 + 1 - 2) // 2 + 1` tokens
  (`processing_qwen2_5_omni._get_feat_extract_output_lengths`, about 25 per second).
  Image: `t * h * w / merge_size**2` of its patch grid;
- `prompt_embeds` `[L, hidden]`: the thinker's `embed_tokens` rows with the audio
  tower's (`Qwen2_5OmniAudioEncoder`) features at the audio positions and the vision
  encoder's (`Qwen2_5OmniVisionEncoder`) merged features at the image positions
  (`Qwen2_5OmniThinkerModel.forward`'s `masked_scatter`);
- `mrope_positions` `[3, L]` and `rope_delta` as
  `Qwen2_5OmniThinkerForConditionalGeneration.get_rope_index` computes them. Outside
  videos (not supported here) audio tokens take ordinary consecutive positions
  there too (time-based audio positions are only for audio interleaved with a
  video, `use_audio_in_video`), so audio-only prompts have plain positions `0..L-1`
  and delta 0 (transformers does not even take its 3-D branch without image /
  video grids); with images the image tokens get (t, h, w) grid positions, and
  what follows continues at `max + 1` — the same rule as Qwen3-Omni's
  (`omnistage.multimodal.mrope.mrope_positions`). The thinker rotates them with
  *non-interleaved* mrope (`Qwen25OmniThinker`);
- no deepstack (`deepstack_embeds` is empty).

`LLMEngine.add_encoded_request` runs an `EncodedPrompt` on the thinker decoder.
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.multimodal.input_encoder import OmniInputEncoder
from omnistage.multimodal.modalities import MediaTokens

TOKENS = MediaTokens(
    audio=("<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>"),
    image=("<|vision_bos|>", "<|IMAGE|>", "<|vision_eos|>"),
)
AUDIO_PLACEHOLDER = TOKENS.placeholder("audio")
IMAGE_PLACEHOLDER = TOKENS.placeholder("image")


def audio_output_lengths(mel_frames: Any):
    """Audio tokens per clip of `mel_frames` valid feature frames (Qwen2.5-Omni's
    `_get_feat_extract_output_lengths`: a stride-2 conv, then stride-2 average pooling)."""
    return ((mel_frames - 1) // 2 + 1 - 2) // 2 + 1


class Qwen25OmniInputEncoder(OmniInputEncoder):
    """Media + placeholder prompt -> expanded ids, prompt embeddings, mrope positions
    (see the module docstring)."""

    model_type = "qwen2_5_omni"
    model_name = "Qwen2.5-Omni"
    tokens = TOKENS

    @classmethod
    def encoder_classes(cls) -> tuple[type, type]:
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
            Qwen2_5OmniAudioEncoder,
            Qwen2_5OmniVisionEncoder,
        )

        return Qwen2_5OmniAudioEncoder, Qwen2_5OmniVisionEncoder

    def feature_extractor_kwargs(self, num_samples: list[int]) -> dict[str, Any]:
        """`Qwen2_5OmniProcessor._process_audio` pads every clip with zeros to the extractor's
        `n_samples` (`padding="max_length"`; 300 s in the released config) and truncates it
        there. The valid mel frames only see zeros past a clip's end, so padding with zeros
        to `n_fft + hop_length` samples past the longest clip (a whole number of hops) gives
        them bit for bit: a frame reads `n_fft / 2` samples either side of its centre, the
        reflect padding at the array's end then mirrors zeros only, and the frames that
        padding to `n_samples` adds are silent, the spectrogram's floor, so they do not
        move the maximum it is clamped against. Same values for a fraction of the STFT
        (0.2 s of CPU per clip otherwise)."""
        fe = self.feature_extractor
        hop = int(fe.hop_length)
        wanted = max(num_samples) + int(fe.n_fft) + hop
        length = min(int(fe.n_samples), -(-wanted // hop) * hop)
        return {"padding": "max_length", "max_length": length, "truncation": True}

    def audio_token_counts(self, mel_frames: torch.Tensor) -> list[int]:
        return [int(n) for n in audio_output_lengths(mel_frames)]

    def num_audio_tokens(self, num_samples: int) -> int:
        """Placeholder tokens for a clip of `num_samples` samples at `sampling_rate` (the
        processor's `_get_num_audio_tokens`: frames capped at the extractor's maximum)."""
        frames = -(-int(num_samples) // self.hop_length)
        if self.feature_extractor is not None:
            frames = min(frames, int(self.feature_extractor.nb_max_frames))
        return int(audio_output_lengths(frames))
