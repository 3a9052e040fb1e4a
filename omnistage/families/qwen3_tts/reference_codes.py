"""Qwen3-TTS voice-clone reference audio: its codec codes, for in-context cloning.

`ReferenceAudioEncoder` computes the clip's codes for in-context cloning, as the
official `qwen-tts` 0.1.1 does (`Qwen3TTSTokenizer.encode` -> `Qwen3TTSTokenizerV2Model
.encode`): the 12 Hz speech tokenizer's encoder is transformers' `MimiModel` (its
decoder half dropped), run on the float waveform `[1, 1, samples]` (the tokenizer's
Encodec feature extractor leaves a single clip unchanged, with an all-ones padding
mask); its codes are cut to the first `encoder_valid_num_quantizers` quantizers and
to `ceil(samples / encode_downsample_rate)` frames. The weights are the `encoder.*`
tensors of `speech_tokenizer/model.safetensors`, in Mimi's original flat layout.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import MimiConfig, MimiModel

# Mimi's flat checkpoint layout -> transformers 5's `MimiModel` (encoder half) layout;
# a rename is used only where the model has no parameter of the original name.
_RENAMES = (
    ("encoder.layers.", "encoder.encoder_seanet.layers."),
    ("encoder_transformer.", "encoder.encoder_transformer."),
    ("downsample.", "encoder.downsample."),
)


def _mimi_encoder(encoder_config: dict[str, Any]) -> MimiModel:
    """transformers' `MimiModel` without its decoder half."""
    config = MimiConfig(**encoder_config)
    if isinstance(getattr(type(config), "decoder_config", None), property):
        config.decoder_config = None  # transformers 5: the halves are derived; drop one
        return MimiModel(config)
    model = MimiModel(config)  # transformers 4: flat, as the reference deletes them
    model.upsample = model.decoder_transformer = model.decoder = None
    return model


def _to_model_names(state: dict[str, torch.Tensor], names: set[str]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        target = key
        if key not in names:
            for old, new in _RENAMES:
                if key.startswith(old) and new + key[len(old) :] in names:
                    target = new + key[len(old) :]
                    break
        out[target] = tensor
    return out


class ReferenceAudioEncoder:
    """The speech tokenizer's encoder: a 24 kHz clip -> `[frames, valid_quantizers]` codes."""

    def __init__(
        self, model: MimiModel, valid_quantizers: int, downsample_rate: int, dtype: torch.dtype
    ) -> None:
        self.model = model
        self.valid_quantizers = valid_quantizers
        self.downsample_rate = downsample_rate
        self.dtype = dtype

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, dtype: torch.dtype = torch.float32
    ) -> ReferenceAudioEncoder:
        """From `path/speech_tokenizer/{config.json, model.safetensors}`; loads strictly."""
        folder = Path(path) / "speech_tokenizer"
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        model = _mimi_encoder(dict(config["encoder_config"]))
        names = set(model.state_dict())
        from omnistage.models.loader import iter_weights

        encoder = {k[len("encoder.") :]: t for k, t in iter_weights(folder, ["encoder."])}
        state = _to_model_names(encoder, names)
        missing, unexpected = sorted(names - set(state)), sorted(set(state) - names)
        if missing or unexpected:
            raise ValueError(
                f"speech tokenizer encoder weights in {folder} do not match its encoder_config: "
                f"missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        model.load_state_dict(state, strict=True)
        model = model.to(dtype).eval()
        valid = int(config.get("encoder_valid_num_quantizers", 16))
        return cls(model, valid, int(config.get("encode_downsample_rate", 1920)), dtype)

    @torch.inference_mode()
    def encode(self, audio: np.ndarray) -> torch.Tensor:
        """`[frames, encoder_valid_num_quantizers]` int64 codes of a mono clip at 24 kHz."""
        samples = np.asarray(audio, dtype=np.float32)
        if samples.ndim != 1 or samples.size == 0:
            raise ValueError(
                f"ref_audio: expected a non-empty 1-D clip, got shape {list(samples.shape)}"
            )
        device = next(self.model.parameters()).device
        wave = torch.from_numpy(samples).to(device=device, dtype=self.dtype)[None, None]
        codes = self.model.encode(wave, num_quantizers=self.valid_quantizers).audio_codes
        frames = math.ceil(samples.size / self.downsample_rate)
        return codes[0, : self.valid_quantizers, :frames].transpose(0, 1).long()
