"""Ming-Omni's audio detokenizer: S3 speech tokens + speaker x-vector -> 22.05 kHz audio.

The reference's `AudioDetokenizer.token2wav` (`modeling_bailing_talker.py`): the flow
(`flow.MingFlow`) makes the mel, HiFT (`hift.MingHiFT`) the waveform, and the first
20 ms are zeroed. Read from the checkpoint's `talker/` folder (`audio_detokenizer.yaml`,
`flow.pt`, `hift.pt`). All randomness (the flow's start noise, HiFT's phases and noise)
comes from one `torch.Generator` seeded per request, drawn in the reference's order, so
a request's audio depends on its tokens, x-vector and seed only.
"""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.families.ming_omni.flow import MingFlow
from omnistage.families.ming_omni.hift import MingHiFT
from omnistage.families.ming_omni.vocoder_config import load_detokenizer_config

SILENCE_S = 0.02


class MingVocoder(torch.nn.Module):
    """flow + HiFT, one request per call (see the module docstring)."""

    def __init__(self, talker_dir: Path, dtype: torch.dtype) -> None:
        super().__init__()
        flow_cfg, hift_cfg = load_detokenizer_config(talker_dir)
        self.flow = MingFlow(flow_cfg)
        self.hift = MingHiFT(hift_cfg)
        for name, module in (("flow.pt", self.flow), ("hift.pt", self.hift)):
            state = torch.load(talker_dir / name, map_location="cpu", weights_only=True)
            missing, unexpected = module.load_state_dict(state, strict=False)
            if missing or unexpected:
                raise ValueError(
                    f"{talker_dir / name}: weights do not match (missing {sorted(missing)[:3]}, "
                    f"unexpected {sorted(unexpected)[:3]})"
                )
        self.to(dtype).eval()
        self.sample_rate = hift_cfg.sampling_rate

    @property
    def speech_vocab(self) -> int:
        return self.flow.config.vocab_size

    @property
    def xvector_dim(self) -> int:
        return self.flow.config.spk_embed_dim

    @torch.inference_mode()
    def token2wav(self, tokens: torch.Tensor, xvector: torch.Tensor, seed: int) -> torch.Tensor:
        """tokens [T] (S3 codes), xvector [spk_embed_dim] -> waveform [samples]."""
        if tokens.numel() == 0:
            raise ValueError("speech tokens: empty")
        if int(tokens.min()) < 0 or int(tokens.max()) >= self.speech_vocab:
            raise ValueError(f"speech tokens: each must be in [0, {self.speech_vocab})")
        generator = torch.Generator().manual_seed(seed)
        noise = torch.randn(self.flow.noise_shape(int(tokens.numel())), generator=generator)
        mel = self.flow.inference(tokens.long(), xvector, noise)
        audio = self.hift.inference(mel, generator)[0].clone()
        audio[: int(self.sample_rate * SILENCE_S)] = 0.0
        return audio
