"""The talker's config (`talker_config` of a Ming-flash-omni-2.0 checkpoint), as a
transformers config: the dense LM's sizes (a Qwen2 decoder, the reference's
`llm_config`, flattened here so the LM reads them as any Qwen2 config) and the latent
heads' settings.

Field names are the reference's (inclusionAI/Ming-omni-tts `modeling_bailingmm.py`, the
dense `model_type`; vLLM-Omni's Ming-flash-omni-2.0 talker config names the same:
`flowmodel`, `aggregator`, `patch_size`, `history_patch_size`, `latent_dim`,
`cfg_strength`, `audio_vae`). The sampler's fixed settings default to the reference's
`generate` defaults: `cfg_strength` 2.0, `sigma` 0.25 (its `max_decode_steps` 200 is the
deploy's `max_tokens`).
"""

from __future__ import annotations

from typing import Any

from transformers import Qwen2Config

from omnistage.families.ming_flash_omni.talker_heads import HeadSettings

STOP_TOKEN_ID = 1
"""The talker's sampled "token" is the stop head's class: 0 go on, 1 stop (its end id)."""
SPEAKER_DIM = 192
"""Width of the CAM++ speaker embedding `spk_head` projects (the reference's constant)."""


class MingFlashTalkerConfig(Qwen2Config):
    """The talker: a Qwen2 LM plus the flow-matching head, aggregator, stop and speaker
    heads, and the audio VAE decoder's sizes (`audio_vae`, see `audio_vae.py`)."""

    model_type = "ming_flash_talker"

    def __init__(
        self,
        latent_dim: int = 64,
        patch_size: int = 4,
        history_patch_size: int = 32,
        flowmodel: dict | None = None,
        aggregator: dict | None = None,
        cfg_strength: float = 2.0,
        sigma: float = 0.25,
        audio_vae: dict | None = None,
        **kwargs: Any,
    ) -> None:
        self.latent_dim = latent_dim
        self.patch_size = patch_size
        self.history_patch_size = history_patch_size
        self.flowmodel = dict(flowmodel or {})
        self.aggregator = dict(aggregator or {})
        self.cfg_strength = float(cfg_strength)
        self.sigma = float(sigma)
        self.audio_vae = dict(audio_vae or {})
        kwargs.setdefault("eos_token_id", STOP_TOKEN_ID)
        super().__init__(**kwargs)
        if self.sigma < 0:
            raise ValueError(f"talker_config.sigma: {sigma} must be >= 0")

    @property
    def heads(self) -> HeadSettings:
        """The flow-matching head's and aggregator's sizes (validated there)."""
        return HeadSettings(
            latent_dim=self.latent_dim,
            patch_size=self.patch_size,
            history_patch_size=self.history_patch_size,
            llm_hidden_size=self.hidden_size,
            flowmodel=self.flowmodel,
            aggregator=self.aggregator,
        )
