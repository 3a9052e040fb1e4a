"""MiMo-Audio's code2wav stage: the audio tokenizer's decoder as a generation-stage model.

Input rows are the LM's steps (`codes.output`, `edges.py`); `edges.audio_frames` turns
them into code frames and the tokenizer decodes them (`audio_decoder.py`) at its
`sampling_rate` (24 kHz), `samples_per_code` samples per frame.

The reference decodes in independent segments (`MimoAudio.forward`: 1500 codes each;
the decoder's GroupNorm makes a segment's audio depend on all of its codes), so this
stage does too, in segments of `segment_steps` LM steps counted from the request's first
(375 = 1500 codes of 4-frame groups). A stream's chunks must be whole segments (the
deploy's chunk sizes multiples of `segment_steps`, the last chunk excepted): then each
chunk decodes with no context and the streamed audio is the whole payload's, bit for
bit. Where text steps sit inside a segment the reference's segments (counted in codes
after the filter) and these (counted in steps) differ; for up to 60 s of speech both are
one segment. The `code2wav_stream` part (`streaming.py`) decodes small chunks instead, as
the tokenizer's `streaming_decode` does.

The tokenizer checkpoint (the Hub's XiaomiMiMo/MiMo-Audio-Tokenizer: `config.json`,
`model.safetensors`) is read from the LM checkpoint's `audio_tokenizer/` folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import torch

from omnistage.families.mimo_audio.audio_decoder import AudioDecoder, Codebooks
from omnistage.families.mimo_audio.config import AudioDecoderConfig, speech_empty_ids
from omnistage.families.mimo_audio.edges import audio_frames
from omnistage.models.generation import GenerationItem, GenerationModel, load_part_module

FOLDER = "audio_tokenizer"
CODEBOOK = "encoder.quantizer.vq.layers.{}._codebook.embed"


class MiMoAudioCode2Wav(GenerationModel):
    architectures = ()  # a part (`audio_tokenizer/`) of MiMo-Audio checkpoints
    output_modality = "audio"
    segment_steps: ClassVar[int] = 375
    """LM steps decoded as one independent segment."""

    def __init__(self, config: AudioDecoderConfig, lm_config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.group_size = int(lm_config.group_size)
        self.empty_ids = speech_empty_ids(lm_config)
        self.empty_token_id = int(lm_config.empty_token_id)
        channels = len(self.empty_ids)
        if channels > config.num_quantizers:
            raise ValueError(
                f"audio_channels: {channels} channels but the tokenizer has "
                f"{config.num_quantizers} quantizers"
            )
        self.codebook_sizes = config.codebook_sizes[:channels]
        if self.empty_ids != self.codebook_sizes:
            raise ValueError(
                f"speech_zeroemb_idx: {self.empty_ids} are not the tokenizer's codebook sizes "
                f"{self.codebook_sizes} (each channel's empty id is one past its codebook)"
            )
        self.codebooks = Codebooks(config, channels).to(dtype)
        self.decoder = AudioDecoder(config).to(dtype).eval()
        self.sample_rate = config.sampling_rate
        self.samples_per_code = config.samples_per_code
        self.dtype = dtype

    @classmethod
    def from_checkpoint(cls, path: Path, hf_config: Any, dtype: torch.dtype) -> MiMoAudioCode2Wav:
        """The decoder of `path/audio_tokenizer/` for the LM whose config is `hf_config`."""
        folder = Path(path) / FOLDER
        config_file = folder / "config.json"
        if not config_file.is_file():
            raise ValueError(
                f"model: {config_file} is missing (put the MiMo-Audio-Tokenizer checkpoint "
                f"in {folder})"
            )
        try:
            config = AudioDecoderConfig.from_dict(json.loads(config_file.read_text()))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{config_file}: {e}") from e
        model = cls(config, hf_config, dtype)
        load_part_module(model.decoder, folder, "decoder.", "audio tokenizer decoder")
        tables = {CODEBOOK.format(i): i for i in range(len(model.codebook_sizes))}
        from omnistage.models.loader import iter_weights

        for name, tensor in iter_weights(folder, ["encoder.quantizer."]):
            if name in tables:
                model.codebooks.tables[tables.pop(name)].data.copy_(tensor.to(dtype))
        if tables:
            raise ValueError(f"{folder}: codebooks missing: {sorted(tables)[:3]}")
        return model.requires_grad_(False)

    def frames(self, rows: torch.Tensor, first_step: int = 0) -> torch.Tensor:
        """The audio frames [frames, channels] of LM steps `rows` (`edges.audio_frames`)."""
        return audio_frames(
            rows,
            self.empty_token_id,
            self.group_size,
            self.empty_ids,
            self.codebook_sizes,
            first_step,
        )

    def check_item(self, item: GenerationItem) -> None:
        start, own = item.offset + item.context_len, item.rows[item.context_len : item.own_end]
        if start % self.segment_steps or (
            not item.last and (start + own.shape[0]) % self.segment_steps
        ):
            raise ValueError(
                f"codes.audio: a chunk of steps {start}..{start + own.shape[0]} is not made of "
                f"whole {self.segment_steps}-step segments (stream chunk sizes must be "
                "multiples of it)"
            )
        self.frames(own, start)

    @torch.inference_mode()
    def decode(self, frames: torch.Tensor) -> torch.Tensor:
        """[frames, channels] codes -> float32 samples (one segment)."""
        device = self.codebooks.tables[0].device
        return self.decoder(self.codebooks(frames.to(device))).float().cpu()

    @torch.inference_mode()
    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        outputs = []
        for item in items:
            own = item.rows[item.context_len : item.own_end]
            start = item.offset + item.context_len
            pieces = [torch.zeros(0, dtype=torch.float32)]
            for at in range(0, own.shape[0], self.segment_steps):
                frames = self.frames(own[at : at + self.segment_steps], start + at)
                if frames.shape[0]:
                    pieces.append(self.decode(frames))
            outputs.append(torch.cat(pieces))
        return outputs
