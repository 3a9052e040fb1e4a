"""`ARStageEngine`: an AR stage's requests on its engine core, reported as output deltas.

The stage's model, core, tokenizer and input checks are built by `LLMEngine`;
this class drives that core itself, with one sequence per request, and turns
each step's core outputs straight into the messages the orchestrator takes:
one `StageOutput` per request with only what is new (its confirmed tokens
and, on a stage that writes text, its new text). Each output is converted
once, here (the `LLMEngine` path builds cumulative `RequestOutput`s for text
frontends; nothing here does).

Only a stage whose output is text (`writes_text`: a final text output, or a
`prompt` edge that takes its text) detokenizes, and only there do stop
strings apply; a talker's codec codes or an image prior's tokens are never
decoded as text. While a stop string may still be completing, its possible
start is held back, so text once sent is never taken back.

Every core output the engine accepts (prompt chunks included) goes first to
`core_output_listener` — the stage's accumulators, which thus see only
confirmed tokens and hidden states (DESIGN.md invariant 6).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from omnistage.config import EngineConfig
from omnistage.core.engine_core_output import EngineCoreOutput
from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.core.request import RequestStatus
from omnistage.engine.detokenizer import IncrementalDetokenizer
from omnistage.engine.input_processor import child_seed
from omnistage.engine.llm_engine import LLMEngine
from omnistage.pipeline.messages import StageOutput
from omnistage.sampling_params import SamplingParams


@dataclass
class _Sequence:
    detok: IncrementalDetokenizer | None
    """Text stages only."""
    holdback: int = 0
    """Characters of text held back while unfinished (a stop string's longest start)."""
    num_text_sent: int = 0
    num_prompt_tokens: int | None = None
    """Positions the prompt takes in the model (media placeholders expanded): reported with
    the sequence's first output, then None."""


class ARStageEngine:
    def __init__(self, config: EngineConfig, stage: str, writes_text: bool) -> None:
        self.stage = stage
        self.writes_text = writes_text
        self._built = LLMEngine(config)
        self.core = self._built.core
        self.config = self._built.config
        self.hf_config = self._built.hf_config
        self.model_files = self._built.model_files
        self.kv_cache_manager = self._built.kv_cache_manager
        self.inputs = self._built.inputs
        """Tokenizing and validating prompts (`InputProcessor`)."""
        self._sequences: dict[str, _Sequence] = {}
        self.core_output_listener: Callable[[str, EngineCoreOutput], None] | None = None
        """Called with (request id, core output) for every step result the core accepts."""

    # -- requests ------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        ids: list[int],
        params: SamplingParams,
        prompt_embeds: torch.Tensor | None = None,
        stream_conditioning: bool = False,
        mm_decoder_inputs: MultimodalDecoderInputs | None = None,
    ) -> None:
        """Start one sequence (`params.n` must be 1); arguments as
        `LLMEngine.add_tokenized_request`. ValueError for what the stage cannot run."""
        if request_id in self._sequences:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        if params.n != 1:
            raise ValueError("n: a pipeline stage generates one sequence per request")
        if params.stop_strings and not self.writes_text:
            raise ValueError(
                f"stop: stage {self.stage!r} writes no text; stop strings apply only to "
                "stages that do"
            )
        built = self._built
        built.check_request(ids, params, prompt_embeds, stream_conditioning, mm_decoder_inputs)
        seed = child_seed(built.request_seed(params), 0)  # as LLMEngine's one sequence
        detok = None
        if self.writes_text:
            detok = IncrementalDetokenizer(
                built.tokenizer,
                ids,
                params.skip_special_tokens,
                params.stop_strings,
                params.include_stop_str_in_output,
            )
        holdback = max((len(s) for s in params.stop_strings), default=1) - 1
        self._sequences[request_id] = _Sequence(detok, holdback, num_prompt_tokens=len(ids))
        self.core.add_request(
            built.inputs.make_request(
                request_id,
                ids,
                params,
                seed,
                prompt_embeds,
                stream_conditioning,
                mm_decoder_inputs,
            )
        )

    def add_conditioning(
        self, request_id: str, rows: torch.Tensor, finished: bool, fill: torch.Tensor | None
    ) -> None:
        """More conditioning rows for a stream-conditioned request (see
        `LLMEngine.add_conditioning`); ignored once the request ended."""
        if request_id not in self._sequences:
            return
        self._built.check_conditioning(rows, fill)
        self.core.scheduler.add_conditioning(request_id, rows, finished, fill)

    def abort_request(self, request_id: str) -> None:
        if self._sequences.pop(request_id, None) is not None:
            self.core.abort_requests([request_id])
        if not self._sequences:
            self.core.flush()

    def has_request(self, request_id: str) -> bool:
        return request_id in self._sequences

    def request_ids(self) -> list[str]:
        """The requests in the engine (started here and not yet ended)."""
        return list(self._sequences)

    def has_unfinished_requests(self) -> bool:
        return bool(self._sequences)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._sequences)

    # -- stepping --------------------------------------------------------------------------
    def step(self) -> list[StageOutput]:
        """One engine step: a `StageOutput` for each request with new tokens or an end."""
        outputs: list[StageOutput] = []
        for out in self.core.step():
            seq = self._sequences.get(out.request_id)
            if seq is None:
                continue  # ended here while the step ran
            if self.core_output_listener is not None:
                self.core_output_listener(out.request_id, out)
            if out.new_token_ids or out.finished:
                outputs.append(self._delta(out, seq))
        if not self._sequences:
            self.core.flush()
        return outputs

    def _delta(self, out: EngineCoreOutput, seq: _Sequence) -> StageOutput:
        tokens, finish_reason, new_text = out.new_token_ids, out.finish_reason, ""
        if seq.detok is not None:
            taken = seq.detok.add_tokens(tokens)
            if taken is not None:  # a stop string: nothing after its last token
                tokens, finish_reason = tokens[:taken], "stop"
                if not out.finished:
                    self.core.finish_requests([out.request_id], RequestStatus.FINISHED_STOPPED)
            elif finish_reason is not None:
                seq.detok.finish()
            text = seq.detok.text
            end = len(text) if finish_reason else max(seq.num_text_sent, len(text) - seq.holdback)
            new_text, seq.num_text_sent = text[seq.num_text_sent : end], end
        if finish_reason is not None:
            del self._sequences[out.request_id]
        num_prompt, seq.num_prompt_tokens = seq.num_prompt_tokens, None
        return StageOutput(
            stage=self.stage,
            request_id=out.request_id,
            new_token_ids=tokens,
            new_text=new_text,
            finished=finish_reason is not None,
            finish_reason=finish_reason,
            num_prompt_tokens=num_prompt,
        )

    def get_tokenizer(self) -> Any:
        return self._built.tokenizer

    def shutdown(self) -> None:
        self._built.shutdown()
