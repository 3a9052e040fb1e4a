"""Ming-Omni's flow (CosyVoice-1's `MaskedDiffWithXvec`): speech tokens + speaker x-vector
-> 80-bin mel, inference only, one request per call.

Ported from the reference `audio_detokenizer/flow/flow.py` under its parameter names
(`input_embedding`, `spk_embed_affine_layer`, `encoder.*`, `encoder_proj`,
`length_regulator.*`, `decoder.estimator.*`), so `flow.pt` loads as is:

    tokens [T] --input_embedding--> Conformer --encoder_proj--> [T, 80]
        --nearest to frames = int(T / input_frame_rate * 22050 / 256)--> regulator convs = mu
    x-vector --L2 normalize--> spk_embed_affine_layer = spks
    noise --8 Euler steps of the U-Net, CFG 0.7--> mel [1, 80, frames]

The reference's prompt-speech path (prompt tokens and features) is unused by Ming (it
passes none); it is not ported. Differences from our CosyVoice3 flow (`cosyvoice3/flow.py`):
a Conformer encoder with relative positions instead of a pre-lookahead conv, a U-Net
estimator instead of a DiT, a fixed token-to-frame ratio, and no streaming chunks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.ming_omni.flow_decoder import ConditionalCFM
from omnistage.families.ming_omni.flow_encoder import ConformerEncoder, InterpolateRegulator
from omnistage.families.ming_omni.vocoder_config import MingFlowConfig


class MingFlow(nn.Module):
    """`MaskedDiffWithXvec.inference` without a speech prompt."""

    def __init__(self, c: MingFlowConfig) -> None:
        super().__init__()
        self.config = c
        self.input_embedding = nn.Embedding(c.vocab_size, c.input_size)
        self.spk_embed_affine_layer = nn.Linear(c.spk_embed_dim, c.output_size)
        self.encoder = ConformerEncoder(
            c.input_size,
            c.encoder_output_size,
            c.encoder_heads,
            c.encoder_linear_units,
            c.encoder_blocks,
        )
        self.encoder_proj = nn.Linear(c.encoder_output_size, c.output_size)
        self.length_regulator = InterpolateRegulator(c.output_size, c.regulator_ratios)
        self.decoder = ConditionalCFM(c)

    def frames(self, tokens: int) -> int:
        """Mel frames for `tokens` speech tokens, computed as the reference does (float32)."""
        length = torch.tensor([tokens], dtype=torch.int32)
        return int((length / self.config.input_frame_rate * 22050 / 256).int().item())

    def noise_shape(self, tokens: int) -> tuple[int, int, int]:
        return (1, self.config.output_size, self.frames(tokens))

    def inference(
        self, tokens: torch.Tensor, xvector: torch.Tensor, noise: torch.Tensor
    ) -> torch.Tensor:
        """tokens [T] (ids < vocab_size), xvector [spk_embed_dim], noise [1, 80, frames]."""
        dtype = self.input_embedding.weight.dtype
        spks = self.spk_embed_affine_layer(F.normalize(xvector.to(dtype).unsqueeze(0), dim=1))
        h = self.encoder(self.input_embedding(tokens.clamp(min=0).unsqueeze(0)))
        h = self.length_regulator(self.encoder_proj(h), self.frames(int(tokens.numel())))
        return self.decoder(h.transpose(1, 2).contiguous(), spks, noise.to(dtype))
