"""CosyVoice3's token2wav (flow -> HiFT) as a generation-stage model.

Input rows are the LM's speech tokens; output is 24 kHz audio. Each request speaks with
its voice (`GenerationItem.speaker`): the flow is conditioned on the voice's speech
tokens, mel frames and speaker embedding, and returns only the new tokens' frames (the
prompt prefix is stripped).

What is spoken is exactly what the reference (`CosyVoice3Model.tts`) produces, whole or
streamed, computed from each item alone (no state kept between a stream's chunks):

- Runs of more than `max_silent_tokens` silence/breath tokens are cut (`llm_job`). The
  cut is causal, so the filtered tokens of a prefix are a prefix of the filtered tokens.
- Whole: the flow with full attention over prompt + tokens, then HiFT to the end.
- Streamed: the flow attends in static chunks of `token_hop_len` tokens counted from the
  prompt's first token, and looks `pre_lookahead_len` tokens ahead; the frames of tokens
  before a chunk boundary that has its look-ahead are final. A chunk's call therefore
  speaks up to the last such boundary; the tokens it speaks from are those the previous
  call (whose rows ended where this item's context ends) could not — the reference's
  `token_offset`, derived here instead of carried. HiFT reruns over all frames so far
  (it is causal with a few frames of look-right) and returns the samples past those the
  previous call returned. The last chunk's new frames come from the full-attention flow
  over everything, the frames before from the streaming flow, as in the reference.

A call runs the flow once for all its items (`CosyVoice3Flow.inference_batch`: right-
padded, grouped by length, one DiT forward per Euler step; every item's audio is bit
for bit its audio alone, see `flow_batch.py`), then HiFT item by item (its cost is
per-sample convolutions; batching it would pad waveforms for little gain on CPU).

Both the reference and this redo the flow over the whole utterance per chunk, so a
chunk's cost grows with the utterance; its boundary schedule is the reference's
(25 tokens + the prompt's padding, then 50, then 100) only in effect — any chunking of
the edge gives the same audio.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnistage.families.cosyvoice3 import voices
from omnistage.families.cosyvoice3.flow import CosyVoice3Flow, FlowConfig
from omnistage.families.cosyvoice3.flow_batch import FlowRequest
from omnistage.families.cosyvoice3.hift import CosyVoice3HiFT, HiFTConfig
from omnistage.models.generation import GenerationItem, GenerationModel, load_part_module


def cut_silence(tokens: list[int], silent: frozenset[int], longest: int) -> list[int]:
    """`tokens` with each run of silent tokens cut to its first `longest`."""
    out, run = [], 0
    for token in tokens:
        if token in silent:
            run += 1
            if run > longest:
                continue
        else:
            run = 0
        out.append(token)
    return out


@dataclass(frozen=True)
class _Plan:
    """One item's work: its flow requests (run batched with the other items') and how
    its audio is cut from their mel."""

    done: int
    """Tokens (past the prompt) whose audio earlier chunks returned."""
    last: bool
    """The stream's end (HiFT flushes)."""
    calls: tuple[FlowRequest, ...]
    """None (nothing new to speak); the flow over the tokens; or, for a stream's last
    chunk, the full-attention flow over all tokens and the streaming flow over those
    already spoken (whose frames the reference keeps)."""


class CosyVoice3Token2Wav(GenerationModel):
    architectures = ()  # a part of CosyVoice3 checkpoints
    output_modality = "audio"
    takes_seeds_and_speakers = True  # speakers; the flow's noise is fixed, seeds unused

    def __init__(self, config: Any, path: Path, dtype: torch.dtype) -> None:
        super().__init__()
        flow_config = FlowConfig.from_dict(config.flow_config)
        hift_config = HiFTConfig.from_dict(config.hift_config)
        # Both draw fixed noise from the global RNG at construction, in the reference's
        # order (flow: seed 0 then its noise; HiFT from the state the flow leaves).
        with torch.random.fork_rng(devices=[]):
            self.flow = CosyVoice3Flow(flow_config)
            self.hift = CosyVoice3HiFT(hift_config)
        self.flow.to(dtype).eval()
        self.hift.eval()
        self.dtype, self.path = dtype, Path(path)
        self.speech_token_size = config.speech_token_size
        self.hop = config.token_hop_len
        self.lookahead = flow_config.pre_lookahead_len
        self.mel_ratio = flow_config.token_mel_ratio
        self.silent = frozenset(config.silent_tokens)
        self.max_silent = config.max_silent_tokens
        self.sample_rate = config.sample_rate

    @classmethod
    def from_checkpoint(cls, path: Path, hf_config: Any, dtype: torch.dtype) -> CosyVoice3Token2Wav:
        model = cls(hf_config, path, dtype)
        load_part_module(model.flow, path, "flow.", "flow")
        load_part_module(model.hift, path, "hift.", "hift")
        return model

    # -- one item ---------------------------------------------------------------------------
    def _tokens(self, rows: torch.Tensor) -> list[int]:
        if rows.ndim != 1 and not (rows.ndim == 2 and rows.shape[1] == 1):
            raise ValueError(f"ids.output: expected [tokens] speech tokens, got {list(rows.shape)}")
        tokens = rows.reshape(-1).tolist()
        if any(t < 0 for t in tokens):
            raise ValueError(f"ids.output: negative token {min(tokens)} (a placeholder?)")
        # The LM's end id (any id past the codebook) is not speech.
        speech = [t for t in tokens if t < self.speech_token_size]
        return cut_silence(speech, self.silent, self.max_silent)

    def _boundary(self, prompt_len: int, available: int) -> int:
        """How many of `available` tokens a streaming call speaks: up to the last chunk
        boundary (counted from the prompt's start) that has its look-ahead."""
        usable = available - self.lookahead
        if usable <= 0:
            return 0
        return max(0, (prompt_len + usable) // self.hop * self.hop - prompt_len)

    def _request(
        self, tokens: list[int], voice: voices.Voice, streaming: bool, finalize: bool
    ) -> FlowRequest:
        return FlowRequest(
            torch.tensor(tokens, dtype=torch.long),
            voice.speech_tokens,
            voice.speech_feat.to(self.dtype),
            voice.embedding.to(self.dtype),
            streaming=streaming,
            finalize=finalize,
        )

    def plan(self, item: GenerationItem) -> _Plan:
        """What the flow must run for `item` (none, one or two flow requests)."""
        voice = voices.voice(self.path, item.speaker)
        tokens = self._tokens(item.rows[: item.own_end])
        prompt_len = int(voice.speech_tokens.shape[0])
        done = 0
        if item.context_len:
            done = self._boundary(prompt_len, len(self._tokens(item.rows[: item.context_len])))
        if item.last:
            if not tokens:
                return _Plan(done, last=True, calls=())
            tail = self._request(tokens, voice, streaming=False, finalize=True)
            if not done:
                return _Plan(done, last=True, calls=(tail,))
            head = self._request(tokens[: done + self.lookahead], voice, True, False)
            return _Plan(done, last=True, calls=(tail, head))
        end = self._boundary(prompt_len, len(tokens))
        if end <= done:
            return _Plan(done, last=False, calls=())
        return _Plan(
            done,
            last=False,
            calls=(self._request(tokens[: end + self.lookahead], voice, True, False),),
        )

    def vocode(self, plan: _Plan, mels: list[torch.Tensor]) -> torch.Tensor:
        """The item's new audio from its flow requests' mel (`[80, frames]` each)."""
        if not mels:
            return torch.zeros(0, dtype=torch.float32)
        if len(mels) == 2:  # the streamed head, then the full-attention tail's new frames
            tail, head = mels
            mel = torch.cat([head, tail[:, plan.done * self.mel_ratio :]], dim=1)
        else:
            (mel,) = mels
        wav = self.hift.inference(mel[None].float(), finalize=plan.last)[0]
        done = plan.done
        already = self.hift.output_samples(done * self.mel_ratio, finalize=False) if done else 0
        return wav[already:].float()

    @torch.inference_mode()
    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        """One flow solver run for every item's flow requests together (padded, see
        `flow_batch`), then HiFT item by item."""
        plans = [self.plan(item) for item in items]
        mels = self.flow.inference_batch([call for plan in plans for call in plan.calls])
        out, start = [], 0
        for plan in plans:
            out.append(self.vocode(plan, mels[start : start + len(plan.calls)]))
            start += len(plan.calls)
        return out
