"""Ming-Omni's vocoder stage: the talker's speech BPE ids -> 22.05 kHz audio.

The reference's path after `BailingTalkerForConditionalGeneration.generate`: the ids
minus the talker tokenizer's length (`omni_tts_binary_generation`), the speech BPE
decode to S3 codes (`s3bpe.S3Bpe`), then `AudioDetokenizer.token2wav` with the
speaker's embedding as the flow's x-vector (`test_talker.py` passes the same
`talker/spks/<name>.pt` as the talker's `vp_emb`) (`vocoder.MingVocoder`).

Whole payloads only: the flow attends over the whole utterance and HiFT's convolutions
look both ways, so a prefix's audio is not a prefix of the whole audio; the reference
does not stream either. A stream chunk that is not the request's last is refused.
The talker's closing `<audio_eos>` (when the stage's ids keep it) is not speech and is
dropped; any other text id is refused (the reference would subtract the tokenizer
length from it and fail in the BPE decode).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omnistage.families.ming_omni.prompt import DEFAULT_SPEAKER, SPEAKERS_DIR
from omnistage.families.ming_omni.s3bpe import S3Bpe
from omnistage.families.ming_omni.vocoder import MingVocoder
from omnistage.models.generation import GenerationItem, GenerationModel


class MingToken2Wav(GenerationModel):
    architectures = ()  # a part of Ming-Omni checkpoints
    output_modality = "audio"
    takes_seeds_and_speakers = True

    def __init__(self, path: Path, dtype: torch.dtype) -> None:
        super().__init__()
        from transformers import AutoTokenizer

        talker_dir = path / "talker"
        self.vocoder = MingVocoder(talker_dir, dtype)
        self.bpe = S3Bpe(talker_dir)
        tokenizer = AutoTokenizer.from_pretrained(talker_dir, local_files_only=True)
        self.text_vocab = len(tokenizer)
        self.eos = int(tokenizer.convert_tokens_to_ids("<audio_eos>"))
        self.path, self.dtype = path, dtype
        self.sample_rate = self.vocoder.sample_rate
        self._speakers: dict[str, torch.Tensor] = {}

    @classmethod
    def from_checkpoint(cls, path: Path, hf_config: Any, dtype: torch.dtype) -> MingToken2Wav:
        return cls(Path(path), dtype)

    def _xvector(self, speaker: str | None) -> torch.Tensor:
        name = speaker or DEFAULT_SPEAKER
        if name not in self._speakers:
            file = self.path / SPEAKERS_DIR / f"{name}.pt"
            if not file.is_file():
                raise ValueError(f"voice: {name!r} is not a speaker of {self.path}")
            row = torch.load(file, map_location="cpu", weights_only=True).reshape(-1)
            if row.numel() != self.vocoder.xvector_dim:
                raise ValueError(
                    f"{file}: {row.numel()} values, the flow takes {self.vocoder.xvector_dim}"
                )
            self._speakers[name] = row.to(self.dtype)
        return self._speakers[name]

    def speech_codes(self, item: GenerationItem) -> torch.Tensor:
        """The item's S3 codes (ValueError for a stream chunk or a non-speech id)."""
        if not item.last or item.context_len or item.lookahead_len:
            raise ValueError(
                "ids.output: Ming-Omni's vocoder takes the whole utterance (transfer: payload)"
            )
        ids = item.rows.reshape(-1).tolist()
        if ids and ids[-1] == self.eos:
            ids = ids[:-1]
        text = [i for i in ids if i < self.text_vocab]
        if text:
            raise ValueError(f"ids.output: {text[0]} is a talker text id, not speech")
        codes = self.bpe.decode([i - self.text_vocab for i in ids])
        if not codes:
            raise ValueError("ids.output: no speech ids to speak")
        return torch.tensor(codes, dtype=torch.long)

    def check_item(self, item: GenerationItem) -> None:
        self.speech_codes(item)
        self._xvector(item.speaker)

    @torch.inference_mode()
    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        """Item by item (see `flow_decoder`: one unpadded utterance per flow call)."""
        return [
            self.vocoder.token2wav(
                self.speech_codes(i), self._xvector(i.speaker), i.seed or 0
            ).float()
            for i in items
        ]
