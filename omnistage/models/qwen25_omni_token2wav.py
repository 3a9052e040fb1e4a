"""Qwen2.5-Omni's token2wav as a generation-stage model (wrapping transformers' module).

Input rows are the talker's codes, one codebook (`[T]` or `[T, 1]`); output is the
waveform, 24 kHz float32. transformers' `Qwen2_5OmniToken2WavModel` is two models:

- a DiT (`Qwen2_5OmniToken2WavDiTModel.sample`) turns the codes into an 80-bin mel
  spectrogram, `repeats` (2) mel frames per code, conditioned on the speaker's `cond`
  vector and reference mel (`spk_dict.pt`), by flow matching: an RK4 ODE solve
  (`num_steps` 10 time points, classifier-free guidance 0.5, sway -1) that starts
  from `torch.randn` noise. Its attention is block-wise (blocks of `block_size` mel
  frames, some layers looking one block back or ahead), not causal;
- BigVGAN turns each mel frame into `prod(upsample_rates)` (5·3·2·2·2·2 = 240)
  samples, clamped to [-1, 1]: **exactly 480 samples per code** (every transposed
  convolution has `padding = (k - s) / 2`, so nothing is trimmed), 50 codes/s.

**Noise and seeds.** transformers draws the noise from torch's global RNG
(`torch.randn([1, 2T, mel_dim], device=codes.device)`), so batch composition and
anything else drawing from that RNG change the waveform. Here each request's
noise is `torch.randn([1, 2T, mel_dim], generator=torch.Generator().manual_seed(seed))`
in float32 on the CPU (then moved to the model's device): the same codes, speaker
and seed give the same waveform alone, in a batch and in any order, and the same
as transformers' `token2wav(...)` after `torch.manual_seed(seed)` on the CPU (the
noise does not depend on the device either; only checked on the CPU). The seed is `generate(...,
seeds=[...])` per request (the generation stage passes one for every request, see
`omnistage.pipeline.generation_stage`); a request without one uses `DEFAULT_SEED`.
Requests are decoded one at a time, as transformers' `generate` does, so a batch
changes nothing.

**Speakers**: `generate(..., speakers=[...])` per request, default "Chelsie"
(transformers' default).

**End codes**: the talker's end ids (`tts_codec_pad` 8292, `tts_codec_end` 8294)
and everything after the first of them are dropped; any other code outside the
DiT's table (`0..num_embeds`, real 8193) is refused with a ValueError (transformers
would fail inside `nn.Embedding`).

**Streaming**: there is none in transformers. A chunk with left context is decoded
together with its context (with the request's seed) and the samples of the
context (`480 * context` of them) are dropped; the result is not the whole
decode's (the noise, the non-causal attention and convolutions all differ),
only a continuation with a seam. Send the codes in one payload for parity.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omnistage.models.generation import GenerationModel, load_part_module

PREFIX = "token2wav."
SAMPLE_RATE = 24000  # of the released model; not stored in its config
SPEAKER_FILE = "spk_dict.pt"
DEFAULT_SPEAKER = "Chelsie"
DEFAULT_SEED = 0


class Qwen25OmniToken2Wav(GenerationModel):
    architectures = ()  # a part of Qwen2_5OmniForConditionalGeneration checkpoints
    output_modality = "audio"
    takes_seeds_and_speakers = True

    def __init__(
        self,
        config: Any,
        speakers: dict[str, dict[str, Any]],
        dtype: torch.dtype = torch.float32,
        num_steps: int = 10,
        guidance_scale: float = 0.5,
        sway_coefficient: float | None = -1.0,
    ) -> None:
        """`config`: the whole checkpoint's `Qwen2_5OmniConfig`. `dtype`: float32 (what
        transformers forces for this part) unless float64 is asked for; anything else
        runs in float32. The weights are left uninitialised: `from_checkpoint` loads them."""
        super().__init__()
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
            Qwen2_5OmniToken2WavModel,
        )

        self.dtype = torch.float64 if dtype == torch.float64 else torch.float32
        t2w = config.token2wav_config
        with _no_init_weights():  # every weight is loaded; the buffers are built either way
            self.module = Qwen2_5OmniToken2WavModel(t2w).to(self.dtype).eval()
        dit = t2w.dit_config
        self.repeats = int(dit.repeats)
        self.mel_dim = int(dit.mel_dim)
        self.max_codes = int(dit.max_position_embeddings) // self.repeats
        self.num_embeds = int(dit.num_embeds)  # the code table has num_embeds + 1 rows
        self.samples_per_code = self.repeats * _prod(t2w.bigvgan_config.upsample_rates)
        talker = config.talker_config
        self.end_ids = torch.tensor(
            [int(talker.tts_codec_pad_token_id), int(talker.tts_codec_end_token_id)]
        )
        self.speakers = {
            name: (
                spk["cond"].to(self.dtype).reshape(1, -1),
                spk["ref_mel"].to(self.dtype).reshape(1, -1, self.mel_dim),
            )
            for name, spk in speakers.items()
        }
        self.num_steps = num_steps
        self.guidance_scale = guidance_scale
        self.sway_coefficient = sway_coefficient
        self.sample_rate = SAMPLE_RATE

    @classmethod
    def from_checkpoint(
        cls, path: Path, hf_config: Any, dtype: torch.dtype = torch.float32
    ) -> Qwen25OmniToken2Wav:
        path = Path(path)
        speaker_file = path / SPEAKER_FILE
        if not speaker_file.is_file():
            raise ValueError(f"{path}: no {SPEAKER_FILE} (the token2wav speakers)")
        speakers = torch.load(speaker_file, weights_only=True)
        model = cls(hf_config, speakers, dtype)
        load_part_module(model.module, path, PREFIX, "token2wav")
        return model

    @torch.inference_mode()
    def decode(
        self, codes: torch.Tensor, seed: int = DEFAULT_SEED, speaker: str = DEFAULT_SPEAKER
    ) -> torch.Tensor:
        """[T] codes -> [480 T] float32 waveform, with this seed's noise."""
        if speaker not in self.speakers:
            known = ", ".join(sorted(self.speakers))
            raise ValueError(f"speaker: {speaker!r} is not one of {known}")
        device = next(self.module.parameters()).device
        cond, ref_mel = (t.to(device) for t in self.speakers[speaker])
        codes = codes.to(device, torch.long)[None]
        frames = codes.shape[1] * self.repeats
        noise = torch.randn(
            (1, frames, self.mel_dim),
            generator=torch.Generator().manual_seed(int(seed)),
            dtype=torch.float32,
        ).to(device, self.dtype)
        mel = self._sample_mel(codes, cond, ref_mel, noise)
        return self.module.code2wav_bigvgan_model(mel).reshape(-1).float()

    def _sample_mel(
        self,
        codes: torch.Tensor,
        cond: torch.Tensor,
        ref_mel: torch.Tensor,
        noise: torch.Tensor,
    ) -> torch.Tensor:
        """`Qwen2_5OmniToken2WavDiTModel.sample`, starting from the given noise."""
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
            RungeKutta4ODESolver,
        )

        dit = self.module.code2wav_dit_model
        guidance = self.guidance_scale
        cond = cond.unsqueeze(1).repeat(1, noise.shape[1], 1)

        def velocity(time_step: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            if guidance < 1e-5:
                return dit(
                    hidden_states=x,
                    speaker_embedding=cond,
                    condition_vector=ref_mel,
                    quantized_code=codes,
                    time_step=time_step,
                    drop_audio_conditioning=False,
                    drop_code=False,
                    apply_cfg=False,
                )
            out = dit(
                hidden_states=x,
                quantized_code=codes,
                speaker_embedding=cond,
                condition_vector=ref_mel,
                time_step=time_step,
                apply_cfg=True,
            )
            guided, unconditioned = torch.chunk(out, 2, dim=0)
            return guided + (guided - unconditioned) * guidance

        times = torch.linspace(0, 1, self.num_steps, device=noise.device, dtype=cond.dtype)
        if self.sway_coefficient is not None:
            times += self.sway_coefficient * (torch.cos(torch.pi / 2 * times) - 1 + times)
        trajectory = RungeKutta4ODESolver(function=velocity, initial_value=noise).integrate(times)
        return trajectory[-1].permute(0, 2, 1)

    @torch.inference_mode()
    def generate(
        self,
        inputs: list[torch.Tensor],
        context_lens: list[int],
        seeds: list[int | None] | None = None,
        speakers: list[str | None] | None = None,
    ) -> list[torch.Tensor]:
        outputs = []
        for i, (codes, context) in enumerate(zip(inputs, context_lens, strict=True)):
            if codes.ndim == 2 and codes.shape[1] == 1:
                codes = codes[:, 0]
            if codes.ndim != 1:
                raise ValueError(
                    f"codes.audio: expected [codes] (one codebook), got {list(codes.shape)}"
                )
            codes = codes.long().cpu()
            ends = torch.isin(codes[context:], self.end_ids).nonzero().flatten()
            if ends.numel():
                codes = codes[: context + int(ends[0])]
            if codes.numel() == context:
                outputs.append(torch.zeros(0, dtype=torch.float32))
                continue
            bad = (codes < 0) | (codes > self.num_embeds)
            if bad.any():
                raise ValueError(
                    f"codes.audio: code {int(codes[bad][0])} is outside the token2wav code "
                    f"table (0..{self.num_embeds})"
                )
            if codes.numel() > self.max_codes:
                raise ValueError(
                    f"codes.audio: {codes.numel()} codes exceed token2wav's "
                    f"{self.max_codes} (dit_config.max_position_embeddings / repeats)"
                )
            seed = seeds[i] if seeds is not None and seeds[i] is not None else DEFAULT_SEED
            speaker = speakers[i] if speakers is not None and speakers[i] else DEFAULT_SPEAKER
            wav = self.decode(codes, seed, speaker)
            outputs.append(wav[context * self.samples_per_code :])
        return outputs


def _no_init_weights() -> Any:
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers < 5
        from transformers.modeling_utils import no_init_weights
    return no_init_weights()


def _prod(values: Any) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out
