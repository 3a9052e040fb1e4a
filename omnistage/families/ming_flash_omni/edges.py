"""Ming-flash-omni-2.0's edges, on the common data plane.

- thinker -> talker (`transfer: prompt`): the talker speaks the thinker's reply text
  alone (the reference's talker takes text, not the thinker's hidden states); its prompt
  is the reply laid out by `talker_prompt.talker_prompt_ids` with the checkpoint's
  tokenizer (built where the orchestrator runs the edge, from the producer's checkpoint).
- talker -> audio_vae (`transfer: payload`): the talker's latent patches
  (`latents.output`, one float row of `patch_size x latent_dim` per step, CONCAT through
  the accumulator; only confirmed steps, with `meta.finished` once at the talker's end)
  are what the audio VAE decoder turns into the waveform.
"""

from __future__ import annotations

from typing import Any

from omnistage.core.edge_processor import (
    LATENTS_KEY,
    Accumulate,
    EdgeProcessor,
    UpstreamResult,
)
from omnistage.core.stage_input import StageInput
from omnistage.families.ming_flash_omni.talker_prompt import talker_prompt_ids


class MingFlashThinkerToTalker(EdgeProcessor):
    """The thinker's reply text becomes the talker's prompt (see the module docstring)."""

    name = "ming_flash_omni_thinker_to_talker"
    reads_text = True

    def __init__(self) -> None:
        self._tokenizers: dict[str, Any] = {}

    def to_prompt(self, upstream: UpstreamResult) -> StageInput:
        if not upstream.text.strip():
            raise ValueError("the thinker's reply is empty: the talker has no text to speak")
        tokenizer = self._tokenizer(upstream.producer_model)
        return StageInput(prompt_token_ids=talker_prompt_ids(tokenizer, upstream.text))

    def _tokenizer(self, checkpoint: str | None) -> Any:
        """The checkpoint's tokenizer (the thinker's and the talker's: one checkpoint)."""
        if checkpoint is None:
            raise ValueError(f"edge processor {self.name!r}: the producer's checkpoint is unknown")
        if checkpoint not in self._tokenizers:
            from transformers import AutoTokenizer

            self._tokenizers[checkpoint] = AutoTokenizer.from_pretrained(
                checkpoint, local_files_only=True
            )
        return self._tokenizers[checkpoint]


class MingFlashTalkerToAudioVAE(EdgeProcessor):
    """The talker's latent patches are the audio VAE decoder's input rows."""

    name = "ming_flash_omni_talker_to_audio_vae"
    accumulate = {LATENTS_KEY: Accumulate.CONCAT}
    stream_key = LATENTS_KEY
    input_key = LATENTS_KEY
