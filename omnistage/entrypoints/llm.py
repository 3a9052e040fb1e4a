"""`LLM`: the offline Python API, shaped like vLLM's so code moves over by changing an import.

from omnistage import LLM, SamplingParams
llm = LLM(model="smollm2")
outs = llm.generate(["Hello"], SamplingParams(max_tokens=32))
print(outs[0].outputs[0].text)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from omnistage.child import exit_on_sigterm
from omnistage.config import DEFAULT_MODEL, EngineConfig
from omnistage.engine.worker_launch import launch_worker
from omnistage.outputs import RequestOutput
from omnistage.sampling_params import SamplingParams

if TYPE_CHECKING:
    from omnistage.engine.input_processor import PromptType

Message = dict[str, Any]


class LLM:
    """An autoregressive model served offline with continuous batching."""

    def __init__(self, model: str = DEFAULT_MODEL, **engine_args: Any) -> None:
        unknown = set(engine_args) - EngineConfig.field_names()
        if unknown:
            raise ValueError(
                f"LLM: unknown engine argument(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(sorted(EngineConfig.field_names()))}"
            )
        config = EngineConfig(model=model, **engine_args)
        exit_on_sigterm()  # SIGTERM unwinds (finally, atexit): the worker is ended, not orphaned
        # The runner's worker starts first; the engine's imports and the tokenizer overlap it.
        launched = launch_worker(config)
        try:
            from omnistage.engine.llm_engine import LLMEngine

            self.engine = LLMEngine(config, launched)
        except BaseException:
            if launched is not None:
                launched.child.close(timeout=0)
            raise
        self._counter = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt (strings or {"prompt_token_ids": [...]}); outputs in prompt order."""
        if not isinstance(prompts, (list, tuple)):
            prompts = [prompts]
        prepared = [self.engine.inputs.tokenize(p) for p in prompts]
        return self._run(prepared, sampling_params, use_tqdm)

    def chat(
        self,
        messages: list[Message] | Sequence[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to each conversation and generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prepared = []
        for conv in conversations:
            text = self.apply_chat_template(conv, add_generation_prompt, chat_template_kwargs)
            ids = self.engine.tokenizer.encode(text, add_special_tokens=False)
            self.engine.inputs.validate_ids(ids)
            prepared.append((text, ids))
        return self._run(prepared, sampling_params, use_tqdm)

    def apply_chat_template(
        self,
        messages: list[Message],
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        tokenizer = self.engine.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("messages: this model has no chat template; use generate()")
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in messages
        ):
            raise ValueError("messages: expected a list of {'role': ..., 'content': ...} dicts")
        return tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **(chat_template_kwargs or {}),
        )

    def _run(
        self,
        prepared: list[tuple[str | None, list[int]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool,
    ) -> list[RequestOutput]:
        params = self._params_per_prompt(sampling_params, len(prepared))
        ids = []
        try:
            for (text, token_ids), p in zip(prepared, params, strict=True):
                request_id = str(next(self._counter))
                self.engine.add_tokenized_request(request_id, text, token_ids, p)
                ids.append(request_id)
            return self._drain(ids, use_tqdm)
        finally:
            # Whatever happened (bad input half-way, KeyboardInterrupt), leave the engine clean.
            self.engine.abort_request([i for i in ids if i in self.engine._tracked])

    def _drain(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        from tqdm.auto import tqdm

        bar = tqdm(
            total=len(ids), desc="Processed prompts", disable=not use_tqdm, dynamic_ncols=True
        )
        with bar:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = out
                        bar.update(1)
        return [done[i] for i in ids]

    @staticmethod
    def _params_per_prompt(
        sampling_params: SamplingParams | Sequence[SamplingParams] | None, n: int
    ) -> list[SamplingParams]:
        if sampling_params is None:
            return [SamplingParams()] * n
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * n
        params = list(sampling_params)
        if len(params) != n:
            raise ValueError(f"sampling_params: {len(params)} given for {n} prompts")
        return params
