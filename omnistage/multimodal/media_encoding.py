"""Running an input encoder's media encoders on one prompt's media: its audio clips
through the feature extractor and the audio tower (`encode_audios`), its images through
the image processor and the vision encoder (`encode_images`), all items of a modality
together, as the models' processors do. Each item is loaded and checked first; an error
names the item. `encoder` is the `OmniInputEncoder` whose methods call these (not
imported here, so the two modules do not import each other).
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.multimodal.media import load_audio, load_image


def encode_audios(encoder: Any, audios: list[Any]) -> tuple[torch.Tensor | None, list[int]]:
    """`([total tokens, hidden] audio-tower features or None without audios, tokens per
    clip)` for `audios` (anything `load_audio` accepts), in `encoder.dtype`."""
    if not audios:
        return None, []
    rate = encoder.sampling_rate
    fe = encoder.feature_extractor
    # The STFT reflect-pads n_fft/2 samples on each side, and one mel frame is a hop.
    min_samples = max(fe.n_fft // 2 + 1, fe.hop_length)
    waves = []
    for k, item in enumerate(audios):
        try:
            wave = load_audio(item, target_rate=rate)
        except ValueError as e:
            raise ValueError(f"audio {k}: {e}") from e
        if len(wave) < min_samples:
            raise ValueError(
                f"audio {k}: too short ({len(wave)} samples at {rate} Hz; at least "
                f"{min_samples} needed)"
            )
        waves.append(wave)
    features, frames = encoder.mel_features(waves)
    counts = encoder.audio_token_counts(frames)
    for k, n in enumerate(counts):
        if n <= 0:
            raise ValueError(
                f"audio {k}: too short ({len(waves[k])} samples at {rate} Hz give no audio tokens)"
            )
    out = encoder.audio_tower(
        features.to(encoder.device), feature_lens=frames.to(encoder.device), return_dict=True
    ).last_hidden_state
    if out.shape[0] != sum(counts):
        raise RuntimeError(f"audio tower gave {out.shape[0]} rows for {sum(counts)} tokens")
    return out.to(encoder.dtype), counts


def encode_images(
    encoder: Any, images: list[Any]
) -> tuple[torch.Tensor | None, list[torch.Tensor], torch.Tensor]:
    """`([total tokens, hidden] merged features or None without images, per deepstack layer
    the `[total tokens, hidden]` deepstack features, [n, 3] patch grids on the CPU)` for
    `images` (anything `load_image` accepts), features in `encoder.dtype`."""
    if not images:
        return None, [], torch.zeros(0, 3, dtype=torch.long)
    loaded = []
    for k, item in enumerate(images):
        try:
            loaded.append(load_image(item))
        except ValueError as e:
            raise ValueError(f"image {k}: {e}") from e
    try:
        inputs = encoder.image_processor(images=loaded, return_tensors="pt")
    except ValueError as e:  # e.g. an aspect ratio over 200
        raise ValueError(f"image: cannot be processed ({e})") from e
    grid = inputs["image_grid_thw"].to(torch.long)
    pixels = inputs["pixel_values"].to(device=encoder.device, dtype=encoder.visual.dtype)
    out = encoder.visual(pixels, grid_thw=grid.to(encoder.device))
    deepstack = getattr(out, "deepstack_features", None) or ()
    return (
        out.pooler_output.to(encoder.dtype),
        [d.to(encoder.dtype) for d in deepstack],
        grid.cpu(),
    )
