"""Ming-flash-omni-2.0's multimodal processor, images: a prompt with `<image>` placeholders
and its images -> the expanded ids, the thinker's input rows, the 3-D positions and the
per-token modality (`EncodedPrompt`).

As the reference does it (vLLM-Omni's port of `processing_bailingmm2.py` /
`modeling_bailingmm2.py`; the reference itself was read, not run):

- each `<image>` becomes `<image>` + `<imagePatch>` x n + `</image>` + `"\\n"`, n = the
  image's patches over the 2x2 merge (v1's expansion: `ming_omni/input_encoder.py`);
- the rows are the thinker's `word_embeddings` with the image encoder's rows
  (`vision.MingFlashImageEncoder`) at the `<imagePatch>` positions, images in order;
- positions are 3-D (`rope.image_positions`), the prompt's `rope_delta` shifts generated
  tokens;
- the per-token modality: IMAGE at the `<imagePatch>` positions only (the reference's
  `image_mask = input_ids == image_patch_token`; v1 routes the whole span), so only they
  go through `image_gate`;
- the image processor is Qwen2-VL's (`smart_resize` to multiples of patch x merge,
  rescale, normalization, temporal tiling) with `preprocessor_config.json`'s settings, its
  patch, merge and temporal sizes defaulting to `vision_config`'s. Not the reference's
  own pre-resize (`fetch_image`), whose factor for this ViT was not seen.

Audio (`processing_bailingmm2.py` `_expand_audio_tokens` and `__call__`,
`modeling_bailing_moe_v2.py` `prompt_wrap_audio`): at most one clip per prompt; its
whisper log-mel features (`audio.log_mel`) have T frames and the encoder
(`audio.MingFlashAudioEncoder`) makes n rows; the placeholder (`<audio>`, or the
reference's text placeholder `<AUDIO>` in a text prompt) becomes `<audio>` +
`<audioPatch>` x n + `</audio>` (a prompt without one gets that block and a newline
appended, as the reference does); the rows go at the `<audioPatch>` run, which is the
AUDIO modality (the reference's `placeholder_audio_loc_lens`: the `<audio>` index + 1,
length n), so exactly those positions route through `audio_gate`. Audio positions are
text positions (the 3-D rotary gives them equal (T, H, W) rows). The clip is read as
mono 16 kHz (`media.load_audio`: channels averaged, soxr resampling; the reference takes
channel 0 and resamples with torchaudio).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from omnistage.families.ming_flash_omni.audio import MingFlashAudioEncoder, log_mel
from omnistage.families.ming_flash_omni.config import BailingMM2Config
from omnistage.families.ming_flash_omni.rope import image_positions
from omnistage.families.ming_flash_omni.vision import MingFlashImageEncoder
from omnistage.families.ming_omni import input_encoder as v1
from omnistage.families.ming_omni.thinker import AUDIO, IMAGE
from omnistage.multimodal.prompts import EncodedPrompt

TEXT_AUDIO = "<AUDIO>"
"""The reference chat template's audio placeholder in text (`apply_chat_template`)."""


class MingFlashInputEncoder(v1.MingInputEncoder):
    """Prompt + images + one clip -> `EncodedPrompt` (see the module docstring)."""

    model_type: ClassVar[str] = "bailingmm_moe_v2_lite"

    def __init__(
        self,
        config: BailingMM2Config,
        tokenizer: Any,
        embeddings: torch.Tensor,
        images: MingFlashImageEncoder,
        processor: Any,
        audio: MingFlashAudioEncoder | None = None,
    ) -> None:
        self.config, self.tokenizer, self.embeddings = config, tokenizer, embeddings
        self.images, self.image_processor = images, processor
        self.audio, self.frontend = audio, None
        names = (v1.IMAGE_START, v1.IMAGE_PATCH, v1.IMAGE_END)
        if audio is not None:
            names += (v1.AUDIO_START, v1.AUDIO_PATCH, v1.AUDIO_END)
        self.ids = v1.special_token_ids(tokenizer, names)
        self.newline = tokenizer("\n", add_special_tokens=False).input_ids

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike, dtype: torch.dtype | str = torch.float32, **_: Any
    ) -> MingFlashInputEncoder:
        from transformers import AutoTokenizer

        from omnistage.models.loader import iter_weights

        path = Path(path)
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        config = BailingMM2Config.from_pretrained(path)
        images = MingFlashImageEncoder.from_checkpoint(path, config, dtype)
        embeddings = dict(iter_weights(path, (v1.EMBEDDINGS,)))[v1.EMBEDDINGS].to(dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
        audio = None
        if config.audio_config:
            audio = MingFlashAudioEncoder.from_checkpoint(path, config, dtype)
        return cls(config, tokenizer, embeddings, images, image_processor(path, config), audio)

    def audio_features(self, item: Any) -> torch.Tensor:
        """[frames, n_mels] whisper log-mel features of one clip (a file, its bytes,
        `(samples, rate)`, or samples at 16 kHz); ValueErrors name `audio`."""
        from omnistage.multimodal.media import load_audio

        if self.audio is None:
            raise ValueError("audio: this Ming-flash-omni checkpoint has no audio encoder")
        rate = 16000
        if isinstance(item, (tuple, str, os.PathLike, bytes, bytearray, memoryview)):
            wave = load_audio(item, target_rate=rate)
        else:
            wave = load_audio(item, rate, target_rate=rate)
        feats = log_mel(wave, self.audio.dims["n_mels"])
        if feats.shape[0] > self.audio.max_frames():
            raise ValueError(
                f"audio: {feats.shape[0] / 100:.1f} s is longer than the encoder's "
                f"{self.audio.max_frames() / 100:.1f} s (whisper_encoder_config.n_ctx)"
            )
        return feats

    def encode(
        self, prompt: str | Sequence[int], audios: Sequence[Any] = (), images: Sequence[Any] = ()
    ) -> EncodedPrompt:
        feats = self._clip(audios)
        if feats is not None and isinstance(prompt, str):
            prompt = prompt.replace(TEXT_AUDIO, v1.AUDIO_START)
        pixels, grid = self._pixels(images)
        counts = self.images.num_tokens(grid) if len(images) else []
        ids = self._expanded_ids(prompt, counts)
        if feats is not None:
            ids = self._audio_ids(ids, self.audio.num_tokens(feats.shape[0]))
        ids_t = torch.tensor(ids, dtype=torch.int64)
        rows = self.embeddings[ids_t].clone()
        patch = ids_t == self.ids[v1.IMAGE_PATCH]
        n = len(ids)
        positions, delta = torch.arange(n).expand(3, -1).clone(), 0
        kinds = None
        if counts:
            rows[patch] = self.images(pixels, grid).to(rows.dtype)
            patch_id, merge = self.ids[v1.IMAGE_PATCH], self.images.merge
            positions, delta = image_positions(ids, patch_id, grid, merge)
            kinds = patch.to(torch.int64) * IMAGE
        if feats is not None:
            heard = ids_t == self.ids[v1.AUDIO_PATCH]
            rows[heard] = self.audio(feats).to(rows.dtype)
            kinds = (kinds if kinds is not None else torch.zeros(n, dtype=torch.int64)).clone()
            kinds[heard] = AUDIO
        return EncodedPrompt(
            prompt_token_ids=ids,
            prompt_embeds=rows,
            mrope_positions=positions,
            rope_delta=delta,
            audio_mask=torch.zeros(n, dtype=torch.bool),
            visual_pos_mask=patch,
            deepstack_embeds=[],
            audio_token_counts=[],
            image_grid_thw=grid,
            token_modality=kinds,
        )

    def _clip(self, audios: Sequence[Any]) -> torch.Tensor | None:
        """The one clip's features, or None (ValueErrors name `audio`)."""
        if not len(audios):
            return None
        if self.audio is None:
            raise ValueError("audio: this Ming-flash-omni checkpoint has no audio encoder")
        if len(audios) > 1:
            raise ValueError(f"audio: {len(audios)} clips; Ming-flash-omni takes one per prompt")
        return self.audio_features(audios[0])

    def _pixels(self, images: Sequence[Any]) -> tuple[torch.Tensor | None, torch.Tensor]:
        if not len(images):
            return None, torch.zeros(0, 3, dtype=torch.long)
        from omnistage.multimodal.media import load_image

        loaded = []
        for k, item in enumerate(images):
            try:
                loaded.append(load_image(item).convert("RGB"))
            except ValueError as e:
                raise ValueError(f"image {k}: {e}") from e
        try:
            out = self.image_processor(images=loaded, return_tensors="pt")
        except ValueError as e:
            raise ValueError(f"image: cannot be processed ({e})") from e
        return out["pixel_values"], out["image_grid_thw"].to(torch.long)


def image_processor(path: Path, config: BailingMM2Config) -> Any:
    """v1's processor settings, the patch / merge / temporal sizes defaulting to the ViT's."""
    from transformers import Qwen2VLImageProcessorPil

    vit = config.vision_config
    data = v1._preprocessor(path)
    settings = {
        "min_pixels": 56 * 56,
        "max_pixels": 28 * 28 * 1280,
        "patch_size": vit.get("patch_size", 16),
        "merge_size": vit.get("spatial_merge_size", 2),
        "temporal_patch_size": vit.get("temporal_patch_size", 2),
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
    } | {k: data[k] for k in v1.PROCESSOR_FIELDS if k in data}
    size = {"shortest_edge": settings.pop("min_pixels"), "longest_edge": settings.pop("max_pixels")}
    return Qwen2VLImageProcessorPil(size=size, **settings)
