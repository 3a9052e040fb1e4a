"""`LLMEngine`: one autoregressive stage driven from the caller's thread.

`add_request` validates and tokenizes, fans an n>1 request out into n
sequences (each with its own seed), and hands them to the engine core.
`step` runs one engine step and turns core outputs into `RequestOutput`s:
incremental text, stop strings (which end the sequence in the core), logprobs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from omnistage.config import EngineConfig
from omnistage.core.engine_core_output import EngineCoreOutput
from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.core.request import RequestStatus
from omnistage.core.step_isolation import StepFailed
from omnistage.engine.builder import eos_token_id, start_stage
from omnistage.engine.detokenizer import IncrementalDetokenizer
from omnistage.engine.input_processor import InputProcessor, PromptType, child_seed
from omnistage.engine.worker_launch import LaunchedWorker
from omnistage.models.loader import load_frontend_tokenizer
from omnistage.models.registry import model_class_for
from omnistage.outputs import CompletionOutput, Logprob, RequestOutput
from omnistage.sampling_params import SamplingParams


@dataclass
class _Sequence:
    index: int
    core_id: str
    detok: IncrementalDetokenizer
    output: CompletionOutput


@dataclass
class _Tracked:
    output: RequestOutput
    seqs: dict[str, _Sequence] = field(default_factory=dict)


class LLMEngine:
    def __init__(self, config: EngineConfig, launched: LaunchedWorker | None = None) -> None:
        """`launched`: the runner worker, already started by `worker_launch.launch_worker`."""
        starting = start_stage(config, launched)
        try:  # the tokenizer loads while the runner starts in its worker process
            self.tokenizer = load_frontend_tokenizer(starting.files)
            stage = starting.finish()
        except BaseException:
            starting.executor.shutdown()
            raise
        self.config = stage.config
        self.core = stage.core
        self.kv_cache_manager = stage.kv_cache_manager
        self.hf_config = stage.hf_config
        self.model_files = stage.files
        self.input_width = model_class_for(self.hf_config).input_width_for(self.hf_config)
        """Width of prompt-embedding and conditioning rows (the model's `input_width`)."""
        eos = eos_token_id(self.hf_config)
        if eos is None:
            eos = getattr(self.tokenizer, "eos_token_id", None)
        self.eos_token_id = eos
        self.inputs = InputProcessor(
            self.tokenizer, self.config.max_model_len, self.hf_config.vocab_size, eos
        )
        self._seed_rng = random.Random(config.seed)
        self._tracked: dict[str, _Tracked] = {}
        self._by_core_id: dict[str, tuple[_Tracked, _Sequence]] = {}
        self.core_output_listener: Callable[[str, EngineCoreOutput], None] | None = None
        """Called with (request id, core output) for every step result the engine accepts,
        before it is applied (a pipeline stage collects hidden states through it)."""

    # -- requests ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams) -> None:
        text, ids = self.inputs.tokenize(prompt)
        self.add_tokenized_request(request_id, text, ids, params)

    def add_tokenized_request(
        self,
        request_id: str,
        text: str | None,
        ids: list[int],
        params: SamplingParams,
        prompt_embeds: torch.Tensor | None = None,
        stream_conditioning: bool = False,
        mm_decoder_inputs: MultimodalDecoderInputs | None = None,
    ) -> None:
        """With `stream_conditioning`, the positions after the prompt wait for one row each
        of `add_conditioning` (added to their input embeddings) until it says `finished`.
        `mm_decoder_inputs`: 3-D rotary positions and deepstack features of a multimodal
        prompt (models with `supports_mrope` / `supports_deepstack`)."""
        core_ids = [request_id] if params.n == 1 else [f"{i}_{request_id}" for i in range(params.n)]
        if request_id in self._tracked:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        # A sequence of an n > 1 request runs as "{i}_{id}": refuse an id that clashes with
        # one before anything is registered (the core would refuse it half-way through).
        clash = next((c for c in core_ids if c in self._by_core_id), None)
        if clash is not None:
            raise ValueError(
                f"request_id: {request_id!r} clashes with the running sequence {clash!r}"
            )
        self.check_request(ids, params, prompt_embeds, stream_conditioning, mm_decoder_inputs)
        base_seed = self.request_seed(params)
        tracked = _Tracked(RequestOutput(request_id=request_id, prompt=text, prompt_token_ids=ids))
        for i, core_id in enumerate(core_ids):
            seq = _Sequence(
                index=i,
                core_id=core_id,
                detok=IncrementalDetokenizer(
                    self.tokenizer,
                    ids,
                    params.skip_special_tokens,
                    params.stop_strings,
                    params.include_stop_str_in_output,
                ),
                output=CompletionOutput(
                    index=i,
                    text="",
                    token_ids=[],
                    logprobs=[] if params.logprobs is not None else None,
                    cumulative_logprob=0.0 if params.logprobs is not None else None,
                ),
            )
            tracked.seqs[core_id] = seq
            tracked.output.outputs.append(seq.output)
        self._tracked[request_id] = tracked
        for seq in tracked.seqs.values():
            self._by_core_id[seq.core_id] = (tracked, seq)
            self.core.add_request(
                self.inputs.make_request(
                    seq.core_id,
                    ids,
                    params,
                    child_seed(base_seed, seq.index),
                    prompt_embeds,
                    stream_conditioning,
                    mm_decoder_inputs,
                )
            )

    def check_request(
        self,
        ids: list[int],
        params: SamplingParams,
        prompt_embeds: torch.Tensor | None = None,
        stream_conditioning: bool = False,
        mm_decoder_inputs: MultimodalDecoderInputs | None = None,
    ) -> None:
        """Refuse a request this engine cannot run: ValueError naming the field (see
        `add_tokenized_request` for the arguments)."""
        self.inputs.validate_ids(ids)
        self.inputs.check_params(params)
        if prompt_embeds is not None:
            self.inputs.check_prompt_embeds(ids, prompt_embeds, self.input_width)
        if mm_decoder_inputs is not None:
            model_class = model_class_for(self.hf_config)
            self.inputs.check_mm_decoder_inputs(
                ids,
                mm_decoder_inputs,
                self.hf_config.hidden_size,
                self.hf_config.num_hidden_layers,
                model_class.supports_mrope,
                model_class.supports_deepstack,
                model_class.token_modalities,
            )
        if stream_conditioning and params.n != 1:
            raise ValueError("n: a stream-conditioned request generates one sequence")

    def request_seed(self, params: SamplingParams) -> int:
        """The base seed of a request's sampling: its own, else one drawn from the engine's
        seed (its n sequences use `child_seed(base, index)`)."""
        return params.seed if params.seed is not None else self._seed_rng.getrandbits(63)

    def check_conditioning(self, rows: torch.Tensor, fill: torch.Tensor | None) -> None:
        """Refuse conditioning rows ([n, input_width]) or a fill row ([input_width]) of the
        wrong width (see `add_conditioning`)."""
        hidden = self.input_width
        if rows.shape[0] and (rows.ndim != 2 or rows.shape[1] != hidden):
            raise ValueError(f"conditioning: expected [rows, {hidden}], got {list(rows.shape)}")
        if fill is not None and tuple(fill.shape) != (hidden,):
            raise ValueError(f"conditioning fill: expected [{hidden}], got {list(fill.shape)}")

    def add_encoded_request(self, request_id: str, prompt: Any, params: SamplingParams) -> None:
        """A multimodal prompt as `omnistage.multimodal.Qwen3OmniInputEncoder.encode` returns
        it (`EncodedPrompt`): its expanded ids, prompt embeddings and, with images, its 3-D
        positions and deepstack features."""
        self.add_tokenized_request(
            request_id,
            None,
            list(prompt.prompt_token_ids),
            params,
            prompt_embeds=prompt.prompt_embeds,
            mm_decoder_inputs=MultimodalDecoderInputs.from_encoded_prompt(prompt),
        )

    def add_conditioning(
        self,
        request_id: str,
        rows: torch.Tensor,
        finished: bool,
        fill: torch.Tensor | None = None,
    ) -> None:
        """Conditioning rows ([n, hidden]) for a stream-conditioned request, in order; with
        `finished`, `fill` ([hidden]) conditions every position after the last row."""
        tracked = self._tracked.get(request_id)
        if tracked is None:
            return
        self.check_conditioning(rows, fill)
        for core_id in tracked.seqs:
            self.core.scheduler.add_conditioning(core_id, rows, finished, fill)

    def abort_request(self, request_ids: str | list[str]) -> None:
        for request_id in [request_ids] if isinstance(request_ids, str) else request_ids:
            tracked = self._tracked.pop(request_id, None)
            if tracked is None:
                continue
            self.core.abort_requests(list(tracked.seqs))
            for seq in tracked.seqs.values():
                self._by_core_id.pop(seq.core_id, None)
        if not self._tracked:
            self.core.flush()

    def has_unfinished_requests(self) -> bool:
        return bool(self._tracked)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._tracked)

    # -- stepping --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One engine step; returns the requests that changed (finished ones last time)."""
        changed: dict[str, RequestOutput] = {}
        try:
            core_outputs = self.core.step()
        except StepFailed as failed:  # the model failed on these alone: they end with "error"
            core_outputs = self._errored(failed.blamed)
        for out in core_outputs:
            entry = self._by_core_id.get(out.request_id)
            if entry is None:
                continue
            tracked, seq = entry
            if self.core_output_listener is not None:
                self.core_output_listener(tracked.output.request_id, out)
            if not out.new_token_ids and not out.finished:
                continue  # a prompt chunk's hidden states: nothing changed for the caller
            self._apply(tracked, seq, out)
            if seq.output.finished:
                self._by_core_id.pop(seq.core_id, None)
            changed[tracked.output.request_id] = tracked.output
        for request_id, output in changed.items():
            if all(o.finished for o in output.outputs):
                output.finished = True
                del self._tracked[request_id]
        if not self._tracked:
            self.core.flush()
        return list(changed.values())

    def _errored(self, core_ids: list[str]) -> list[EngineCoreOutput]:
        """End sequences a step failed on (finish reason "error"); the engine goes on."""
        self.core.finish_requests(core_ids, RequestStatus.FINISHED_ERROR)
        reason = RequestStatus.FINISHED_ERROR.finish_reason
        return [
            EngineCoreOutput(request_id=c, new_token_ids=[], finish_reason=reason) for c in core_ids
        ]

    def _apply(self, tracked: _Tracked, seq: _Sequence, out: EngineCoreOutput) -> None:
        comp = seq.output
        new_tokens = out.new_token_ids
        taken = seq.detok.add_tokens(new_tokens)
        stopped = taken is not None
        if stopped:
            new_tokens = new_tokens[:taken]  # nothing after the stop string's last token
        comp.token_ids.extend(new_tokens)
        if out.new_logprobs and comp.logprobs is not None:
            for token, entry in zip(new_tokens, out.new_logprobs, strict=False):
                comp.logprobs.append(self._logprob_dict(seq, token, entry))
                comp.cumulative_logprob += entry[1][0]
        if out.finished and not stopped:
            seq.detok.finish()
        comp.text = seq.detok.text
        tracked.output.num_cached_tokens = max(
            tracked.output.num_cached_tokens, out.num_cached_tokens
        )
        comp.num_draft_tokens = max(comp.num_draft_tokens, out.num_draft_tokens)
        comp.num_accepted_tokens = max(comp.num_accepted_tokens, out.num_accepted_tokens)
        if stopped and not out.finished:
            self.core.finish_requests([seq.core_id], RequestStatus.FINISHED_STOPPED)
        if stopped:
            comp.finish_reason, comp.stop_reason = "stop", seq.detok.stop_reason
        elif out.finished:
            comp.finish_reason, comp.stop_reason = out.finish_reason, out.stop_reason

    def _logprob_dict(
        self, seq: _Sequence, token: int, entry: tuple[list[int], list[float], int]
    ) -> dict[int, Logprob]:
        ids, lps, rank = entry
        result = {ids[0]: Logprob(lps[0], rank, seq.detok.decode_token(ids[0]))}
        for r, (tid, lp) in enumerate(zip(ids[1:], lps[1:], strict=True), start=1):
            result.setdefault(tid, Logprob(lp, r, seq.detok.decode_token(tid)))
        return result

    # -- introspection -------------------------------------------------------------------------
    def num_free_kv_blocks(self) -> int:
        return self.kv_cache_manager.num_free_blocks

    def num_usable_kv_blocks(self) -> int:
        return self.kv_cache_manager.pool.num_usable_blocks

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def shutdown(self) -> None:
        self.core.shutdown()
