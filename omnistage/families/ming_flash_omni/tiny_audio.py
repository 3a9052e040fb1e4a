"""The tiny Ming-flash-omni-2.0 checkpoint's audio encoder: a small Whisper encoder
(`audio.*`, openai-whisper's names) and the projector (`linear_proj_audio.*`), in
`audio.safetensors` beside the thinker's file (whose bytes, and so its fixture's digest,
stay as they were). The positional table is not stored (the reference's is a buffer)."""

from __future__ import annotations

from typing import Any

import torch

AUDIO_WEIGHTS = "audio.safetensors"
AUDIO_SPECIALS = ["<audioPatch>", "</audio>"]
"""Added after the talker's specials (which already hold `<audio>`), so no earlier id moves."""
TINY_AUDIO: dict[str, Any] = {
    "ds_kernel_size": 3,
    "ds_stride": 2,
    "norm_query_embeds": True,
    "whisper_encoder_config": {
        "n_ctx": 200,
        "n_head": 2,
        "n_layer": 2,
        "n_mels": 128,
        "n_state": 32,
    },
}
"""The real `audio_config`'s fields at small sizes (real: n_ctx 15000, n_head 20, n_layer 32,
n_mels 128 as here: whisper has mel filters for 80 and 128 only, n_state 1280)."""


def tiny_audio_weights(hidden_size: int, mlp_depth: int, seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights of the encoder and projector, by the checkpoint's names: N(1, 0.1) for
    LayerNorm weights, N(0, 1) / sqrt(fan-in) for matrices, N(0, 0.05) for other vectors."""
    from omnistage.families.ming_flash_omni.audio import MingFlashAudioEncoder

    model = MingFlashAudioEncoder(TINY_AUDIO, hidden_size, mlp_depth)
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in model.state_dict().items():
        if name.endswith("positional_embedding"):
            continue
        if "ln" in name.rsplit(".", 2)[-2] and name.endswith("weight"):
            out[name] = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
        elif p.dim() >= 2:
            out[name] = torch.randn(p.shape, generator=g) * (p[0].numel() ** -0.5)
        else:
            out[name] = 0.05 * torch.randn(p.shape, generator=g)
    return out
