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
anything else drawing from that RNG change the waveform. Here the noise of mel
frame `f` of a request is `torch.randn(mel_dim)` from a CPU generator seeded with
`row_seed(seed, f)` (`omnistage.sample.sampler`), float32, then moved to the
model's device: it depends only on the request's seed and the frame's index, so
the same codes, speaker and seed give the same waveform alone, in a batch, in
any order and on any device, and a stream chunk starts from exactly the noise
the whole decode has at its frames. Given that noise (`noise(seed, 0, 2T)`),
the whole decode is transformers' `token2wav(...)` (its `torch.randn` replaced
by that tensor). The seed is `GenerationItem.seed` per request (the generation
stage passes one for every request, see `omnistage.pipeline.generation_stage`);
a request without one uses `DEFAULT_SEED`. Requests are decoded one at a time,
as transformers' `generate` does, so a batch changes nothing.

**Speakers**: `GenerationItem.speaker` per request, default "Chelsie"
(transformers' default).

**End codes**: the talker's end ids (`tts_codec_pad` 8292, `tts_codec_end` 8294)
and everything after the first of them are dropped, wherever it is in the item; any
other code outside the DiT's table (`0..num_embeds`, real 8193) is refused with a
ValueError (transformers would fail inside `nn.Embedding`) as the item arrives
(`check_item`: it fails its own request).

**Streaming** (there is none in transformers). A chunk's item (codes
`[start - left, end + right)` of the request, see `GenerationItem`) runs the DiT
over all its codes, from their noise, with the rotary positions and attention
blocks those mel frames have in the whole utterance (transformers numbers them
from 0), then BigVGAN over the mel of `[start, end)` with up to
`vocoder_context` mel frames either side (its receptive field, see
`bigvgan_context`: 34 frames real, 26 tiny), and returns the samples of
`[start, end)`: exactly `480 * (end - start)`, so the chunks add up to the
whole decode's length. The values are the whole decode's up to how much the
codes beyond the item's window matter: none to BigVGAN (its context is
complete when it fits in the window), but the DiT is not local: each of its
passes attends one block ahead and one or two back, and the ODE solve runs it
36 times (9 RK4 steps), so the whole decode's mel at a frame depends, ever more
faintly, on codes far beyond any window. The differences are largest at the
seams, on the last codes of a chunk (nearest its right edge) and the first
ones (nearest its left edge), and fall off with the context. Measured on the
tiny checkpoint (block 4 codes; 64 codes, chunks 6 then 8; max |streamed -
whole| over 3 seeds, waveform peak 1): in float64 right/left context 24/24
codes: 6e-8 (float32 output rounding), 16/16: 3e-5, 12/40: 6e-4, 8/24: 2e-2,
24/8: 9e-3, 4/8: 0.17, no context: 1.4; in float32 24/24: 1e-5 (float32
rounding through the solve). Send the codes in one payload for the exact whole
decode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omnistage.models.generation import GenerationItem, GenerationModel, load_part_module

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
        self.hop_length = _prod(t2w.bigvgan_config.upsample_rates)  # samples per mel frame
        self.samples_per_code = self.repeats * self.hop_length
        self.vocoder_context = bigvgan_context(self.module.code2wav_bigvgan_model)
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
        """[T] codes -> [480 T] float32 waveform, with this seed's noise (the whole decode)."""
        return self.decode_window(codes, 0, 0, codes.shape[0], seed, speaker)

    @torch.inference_mode()
    def decode_window(
        self,
        codes: torch.Tensor,
        offset: int,
        own_start: int,
        own_end: int,
        seed: int = DEFAULT_SEED,
        speaker: str = DEFAULT_SPEAKER,
    ) -> torch.Tensor:
        """`codes` [T]: codes `offset .. offset + T` of an utterance -> the float32 waveform
        of `codes[own_start:own_end]` (480 samples per code). The DiT sees all T codes and
        their noise, in the utterance's mel frame positions and attention blocks; BigVGAN
        sees the own codes' mel frames and up to `vocoder_context` frames either side."""
        if speaker not in self.speakers:
            known = ", ".join(sorted(self.speakers))
            raise ValueError(f"speaker: {speaker!r} is not one of {known}")
        device = next(self.module.parameters()).device
        cond, ref_mel = (t.to(device) for t in self.speakers[speaker])
        codes = codes.to(device, torch.long)[None]
        first, frames = offset * self.repeats, codes.shape[1] * self.repeats
        noise = self.noise(int(seed), first, frames).to(device, self.dtype)
        mel = self._sample_mel(codes, cond, ref_mel, noise, first)  # [1, mel_dim, frames]
        lo = max(0, own_start * self.repeats - self.vocoder_context)
        hi = min(frames, own_end * self.repeats + self.vocoder_context)
        wav = self.module.code2wav_bigvgan_model(mel[:, :, lo:hi]).reshape(-1).float()
        cut = (own_start * self.repeats - lo) * self.hop_length
        return wav[cut : cut + (own_end - own_start) * self.samples_per_code]

    def noise(self, seed: int, first_frame: int, frames: int) -> torch.Tensor:
        """The DiT's starting noise for mel frames `first_frame .. first_frame + frames` of an
        utterance with this seed: [1, frames, mel_dim] float32 on the CPU, each frame's row
        `torch.randn(mel_dim)` from a generator seeded with `row_seed(seed, frame)`."""
        from omnistage.sample.sampler import row_seed

        generator = torch.Generator()
        out = torch.empty(frames, self.mel_dim, dtype=torch.float32)
        for i in range(frames):
            generator.manual_seed(row_seed(seed, first_frame + i))
            out[i] = torch.randn(self.mel_dim, generator=generator, dtype=torch.float32)
        return out[None]

    def _sample_mel(
        self,
        codes: torch.Tensor,
        cond: torch.Tensor,
        ref_mel: torch.Tensor,
        noise: torch.Tensor,
        first_frame: int = 0,
    ) -> torch.Tensor:
        """`Qwen2_5OmniToken2WavDiTModel.sample`, starting from the given noise, for mel frames
        `first_frame ..` of an utterance: the DiT's rotary positions and attention blocks are
        the utterance's (transformers' `forward` numbers them from 0, which is the same for
        `first_frame` 0)."""
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
            RungeKutta4ODESolver,
        )

        dit = self.module.code2wav_dit_model
        guidance = self.guidance_scale
        frames = noise.shape[1]
        cond = cond.unsqueeze(1).repeat(1, frames, 1)
        positions = torch.arange(first_frame, first_frame + frames, device=noise.device)
        blocks = positions // dit.block_size
        block_diff = blocks[None, :] - blocks[:, None]  # [query, key], as _create_block_diff
        code_embed = dit.text_embed(codes, drop_code=False)
        code_embed_uncond = dit.text_embed(codes, drop_code=True)

        def forward(x: torch.Tensor, time_step: torch.Tensor, apply_cfg: bool) -> torch.Tensor:
            """`Qwen2_5OmniToken2WavDiTModel.forward` at these positions."""
            batch = x.shape[0] * (2 if apply_cfg else 1)
            time = dit.time_embed(time_step.repeat(batch))
            hidden = dit.input_embed(
                x,
                cond,
                ref_mel,
                code_embed,
                drop_audio_cond=False,
                code_embed_uncond=code_embed_uncond if apply_cfg else None,
                apply_cfg=apply_cfg,
            )
            rotary = dit.rotary_embed(hidden, positions[None].repeat(batch, 1))
            diff = block_diff.expand(batch, dit.num_attention_heads, frames, frames)
            for layer in dit.transformer_blocks:
                hidden = layer(hidden, time, position_embeddings=rotary, block_diff=diff)
            return dit.proj_out(dit.norm_out(hidden, time))

        def velocity(time_step: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            if guidance < 1e-5:
                return forward(x, time_step, apply_cfg=False)
            guided, unconditioned = torch.chunk(forward(x, time_step, apply_cfg=True), 2, dim=0)
            return guided + (guided - unconditioned) * guidance

        times = torch.linspace(0, 1, self.num_steps, device=noise.device, dtype=cond.dtype)
        if self.sway_coefficient is not None:
            times += self.sway_coefficient * (torch.cos(torch.pi / 2 * times) - 1 + times)
        trajectory = RungeKutta4ODESolver(function=velocity, initial_value=noise).integrate(times)
        return trajectory[-1].permute(0, 2, 1)

    @torch.inference_mode()
    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        return [self._generate_one(item) for item in items]

    def speech_codes(self, item: GenerationItem) -> tuple[torch.Tensor, int]:
        """The item's codes up to the talker's first end code (wherever it is: in the own
        rows, the right context, or the left context, when the chunk comes after the end),
        every one checked against the DiT's table; and where the own rows end in them."""
        codes = item.rows
        if codes.ndim == 2 and codes.shape[1] == 1:
            codes = codes[:, 0]
        if codes.ndim != 1:
            raise ValueError(
                f"codes.audio: expected [codes] (one codebook), got {list(codes.shape)}"
            )
        codes = codes.long().cpu()
        own_end = item.own_end
        ends = torch.isin(codes, self.end_ids).nonzero().flatten()
        if ends.numel():  # the end and what follows are not speech, as context neither
            codes = codes[: int(ends[0])]
            own_end = min(own_end, codes.numel())
        bad = (codes < 0) | (codes > self.num_embeds)
        if bad.any():
            raise ValueError(
                f"codes.audio: code {int(codes[bad][0])} is outside the token2wav code "
                f"table (0..{self.num_embeds})"
            )
        if item.offset + codes.numel() > self.max_codes:
            raise ValueError(
                f"codes.audio: {item.offset + codes.numel()} codes exceed token2wav's "
                f"{self.max_codes} (dit_config.max_position_embeddings / repeats)"
            )
        return codes, own_end

    def check_item(self, item: GenerationItem) -> None:
        self.speech_codes(item)

    def _generate_one(self, item: GenerationItem) -> torch.Tensor:
        codes, own_end = self.speech_codes(item)
        context = item.context_len
        if own_end <= context:  # nothing of its own before the end
            return torch.zeros(0, dtype=torch.float32)
        seed = DEFAULT_SEED if item.seed is None else item.seed
        speaker = item.speaker or DEFAULT_SPEAKER
        return self.decode_window(codes, item.offset, context, own_end, seed, speaker)


def bigvgan_context(bigvgan: Any) -> int:
    """How many mel frames on either side of a frame transformers'
    `Qwen2_5OmniToken2WavBigVGANModel` reads to write that frame's samples: its receptive
    field, from the module's convolutions and anti-aliased activations (34 for the real
    config, 26 for the tiny test one; the far frames weigh little). Decoding a stretch of
    mel frames with this many more on both sides gives the stretch's samples of a decode
    of all frames."""

    def conv(lo: int, hi: int, c: Any) -> tuple[int, int]:  # Conv1d, stride 1
        (k,), (d,), (p,) = c.kernel_size, c.dilation, c.padding
        return lo - p, hi - p + (k - 1) * d

    def transposed(lo: int, hi: int, c: Any) -> tuple[int, int]:  # ConvTranspose1d
        (k,), (s,), (p,) = c.kernel_size, c.stride, c.padding
        return -((k - 1 - lo - p) // s), (hi + p) // s

    def activation(lo: int, hi: int, act: Any) -> tuple[int, int]:  # up 2x, snake, down 2x
        down, up = act.downsample, act.upsample
        lo, hi = lo * down.stride - down.pad_left, hi * down.stride + down.kernel_size - 1
        hi -= down.pad_left
        r, k = up.stride, up.kernel_size
        return (
            -((k - 1 - lo - up.pad_left) // r) - up.pad,
            (hi + up.pad_left) // r - up.pad,
        )

    def amp(lo: int, hi: int, block: Any) -> tuple[int, int]:  # AMPBlock, back to front
        acts = list(block.activations)
        units = list(zip(block.convs1, block.convs2, acts[::2], acts[1::2], strict=True))
        for conv1, conv2, act1, act2 in reversed(units):  # each unit is residual
            a, b = conv(lo, hi, conv2)
            a, b = activation(a, b, act2)
            a, b = conv(a, b, conv1)
            a, b = activation(a, b, act1)
            lo, hi = min(lo, a), max(hi, b)
        return lo, hi

    hop = _prod(bigvgan.config.upsample_rates)
    lo, hi = conv(0, hop - 1, bigvgan.conv_post)  # the samples of mel frame 0
    lo, hi = activation(lo, hi, bigvgan.activation_post)
    per_level = bigvgan.num_residual_blocks
    for level in reversed(range(bigvgan.num_upsample_layers)):
        blocks = bigvgan.resblocks[level * per_level : (level + 1) * per_level]
        spans = [amp(lo, hi, block) for block in blocks]
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        lo, hi = transposed(lo, hi, bigvgan.ups[level][0])
    lo, hi = conv(lo, hi, bigvgan.conv_pre)
    return max(-lo, hi)


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
