"""Covo-Audio's code2wav stage: the fused LM's output ids -> speech codes -> waveform.

Input rows are the LM's output token ids, text and speech interleaved. The per-family
token filter (`speech_codes`, seed 003's "filter of non-audio tokens") keeps the ids
from `audio_token_index` to `audio_token_index + token_vocab_size` and turns each into
its code (`id - audio_token_index`), in order; text, control ids and anything past the
codebook are dropped, as the reference's `process_output` drops them (`example.py`).

The decode is the reference's `Token2WavDecoder.inference` (`token2wav/models/
audio_decoder.py`): the speaker prompt's codes go in front of the request's, the
flow-matching DiT (`dit.Token2Latent`) writes latents for all of them with the prompt's
latents known, the latents are de-normalised with `global_mean_var.npy`, the prompt's
frames are cut off, and BigVGAN (`bigvgan.BigVGAN`) speaks the rest. The starting noise
is drawn from the request's seed (`torch.randn` of a generator seeded with it: the
reference's draw after `torch.manual_seed(seed)`).

The DiT attends over the whole utterance, so no code's audio is final before the last
code is known: a stream's chunks give no audio until its last, which decodes every code
of the request (the edge's `left_context` must reach back to the first; a ValueError
says so otherwise), so streamed and whole audio are the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnistage.families.covo_audio.bigvgan import BigVGAN, fold_weight_norm
from omnistage.families.covo_audio.config import RELEASED_TOKEN2WAV, Token2WavConfig
from omnistage.families.covo_audio.dit import Token2Latent
from omnistage.models.generation import GenerationItem, GenerationModel

FOLDER = "token2wav"
PROMPT_FOLDER = "prompt"
PROMPT_FILES = ("prompt_token.npy", "prompt_latent.npy", "speaker_embed.npy")


def speech_codes(ids: torch.Tensor, audio_token_index: int, codebook: int) -> torch.Tensor:
    """The speech codes among the LM's output `ids`, in order (the per-family token filter)."""
    ids = ids.reshape(-1).long()
    keep = (ids >= audio_token_index) & (ids < audio_token_index + codebook)
    return ids[keep] - audio_token_index


class SpeakerPrompt:
    """The voice: a prompt's codes `[1, n]`, their latents `[1, n x upsample, z]` and a speaker
    embedding `[1, spkr_embed_dim]` (`token2wav/prompt/*.npy`)."""

    def __init__(self, folder: Path) -> None:
        missing = [f for f in PROMPT_FILES if not (folder / f).is_file()]
        if missing:
            raise ValueError(
                f"model: {folder} lacks {', '.join(missing)} (the speaker prompt; the real "
                "files are token2wav/prompt/ in github.com/Tencent/Covo-Audio)"
            )
        self.codes = torch.from_numpy(np.load(folder / PROMPT_FILES[0])).long().reshape(1, -1)
        self.latents = torch.from_numpy(np.load(folder / PROMPT_FILES[1])).float()
        self.speaker = torch.from_numpy(np.load(folder / PROMPT_FILES[2])).float().reshape(1, -1)


class CovoAudioCode2Wav(GenerationModel):
    architectures = ()  # a part (`token2wav/`) of Covo-Audio checkpoints
    output_modality = "audio"
    takes_seeds_and_speakers = True

    def __init__(
        self, config: Token2WavConfig, audio_token_index: int, prompt: SpeakerPrompt
    ) -> None:
        super().__init__()
        self.config = config
        self.token2latent = Token2Latent(config.dit)
        self.wavegan = BigVGAN(config.vocoder)
        z = config.dit.z_dim
        self.register_buffer("global_mean", torch.zeros(z))
        self.register_buffer("global_var", torch.ones(z))
        self.audio_token_index = audio_token_index
        self.prompt = prompt
        self.sample_rate = config.sample_rate
        if prompt.latents.shape[-1] != z or prompt.speaker.shape[-1] != config.dit.spkr_embed_dim:
            raise ValueError("model: the speaker prompt's widths are not the token2wav model's")

    @classmethod
    def from_checkpoint(cls, path: Path, hf_config: Any, dtype: torch.dtype) -> CovoAudioCode2Wav:
        """`path/token2wav/`: `model.pt`, `global_mean_var.npy`, `prompt/`, and `config.json`
        (the released model's when absent)."""
        folder = Path(path) / FOLDER
        for name in ("model.pt", "global_mean_var.npy"):
            if not (folder / name).is_file():
                raise ValueError(f"model: {folder / name} is missing (Covo-Audio's token2wav)")
        config_file = folder / "config.json"
        try:
            raw = (
                json.loads(config_file.read_text()) if config_file.is_file() else RELEASED_TOKEN2WAV
            )
            config = Token2WavConfig.from_dict(raw)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{config_file}: {e}") from e
        model = cls(config, int(hf_config.audio_token_index), SpeakerPrompt(folder / PROMPT_FOLDER))
        state = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
        model.load_weights(state.get("model", state))
        mean_var = torch.from_numpy(np.load(folder / "global_mean_var.npy")).float().reshape(-1)
        model.global_mean.copy_(mean_var[: mean_var.numel() // 2])
        model.global_var.copy_(mean_var[mean_var.numel() // 2 :])
        return model.to(dtype).eval()

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """`token2latent.*` and `wavegan.*` of `model.pt` (a `module.` prefix dropped, weight
        norm folded); every parameter must be there. Keys of parts not run here (the VAE's
        encoder side) are ignored."""
        state = {k.removeprefix("module."): v for k, v in state.items()}
        state = fold_weight_norm(state)
        own = {k for k in self.state_dict() if k.startswith(("token2latent.", "wavegan."))}
        missing = sorted(own - state.keys())
        if missing:
            raise ValueError(f"model.pt: missing {missing[:3]} ({len(missing)} in all)")
        self.load_state_dict({k: state[k] for k in own}, strict=False)

    def codes(self, item: GenerationItem) -> torch.Tensor:
        return speech_codes(
            item.rows[: item.own_end], self.audio_token_index, self.config.dit.token_vocab_size
        )

    def check_item(self, item: GenerationItem) -> None:
        if item.last and item.offset != 0:
            raise ValueError(
                "code2wav: Covo-Audio decodes a request's codes all at once; the edge's "
                "left_context must reach back to its first token"
            )

    @torch.inference_mode()
    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        outputs = []
        for item in items:
            codes = self.codes(item) if item.last else self.codes(item)[:0]
            outputs.append(self.decode(codes, item.seed) if codes.numel() else torch.zeros(0))
        return outputs

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor, seed: int | None) -> torch.Tensor:
        """The waveform (float32) of speech `codes` `[n]`, with the starting noise of `seed`."""
        dtype, device = self.global_mean.dtype, self.global_mean.device
        prompt = self.prompt
        tokens = torch.cat([prompt.codes, codes.reshape(1, -1)], dim=1).to(device)
        rows = self.token2latent.embed_codes(tokens)
        frames, z = rows.shape[1], self.config.dit.z_dim
        generator = torch.Generator().manual_seed(0 if seed is None else seed)
        noise = torch.randn([1, frames, z], generator=generator).to(device, dtype)
        known = torch.zeros(1, frames, z, dtype=dtype, device=device)
        prefix = prompt.latents.to(device, dtype)
        known[:, : prefix.shape[1]] = prefix
        latents = self.token2latent.sample(
            rows, known, noise, prompt.speaker.to(device, dtype), self.config.steps,
            self.config.cfg_alpha,
        )  # fmt: skip
        latents = self.global_mean + latents * torch.sqrt(self.global_var)
        latents = latents[:, prefix.shape[1] :]
        return self.wavegan(latents.transpose(1, 2))[0, 0].float().cpu()
