"""`AsyncEngineClient`: an `LLMEngine` stepped on its own thread, driven from asyncio.

The engine is not thread-safe, so one thread owns it: the event loop hands it
commands (add, abort, stop) through a queue and the thread runs them between
steps. Each request streams `RequestDelta`s into its own asyncio queue
(`loop.call_soon_threadsafe`), so handlers simply iterate a `RequestStream`:

    stream = await client.add_request(prompt_ids, params)   # ValueError: bad input
    async with stream:                                        # leaving early aborts it
        async for delta in stream:
            ...

Tokenization, validation and the context-length check run on the engine thread
inside the add command, so `add_request` raises the engine's `ValueError` (naming
the field) before any response is started. An abort frees everything the request
holds in the engine (KV blocks, batch rows), as `LLMEngine.abort_request` does.

It is the text model's `client.EngineClient`: to the serving layer, a one-stage
pipeline ("llm") that writes text, with `n` samples and logprobs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from omnistage.engine.llm_engine import LLMEngine
from omnistage.entrypoints.openai.client import (
    ChatPrompt,
    EngineDeadError,
    EngineObserver,
    EngineStats,
)
from omnistage.entrypoints.openai.deltas import DeltaTracker, RequestDelta, TokenTexts
from omnistage.entrypoints.openai.errors import public_text
from omnistage.entrypoints.openai.request_stream import RequestStream
from omnistage.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_STOP = object()
"""The last command: the engine thread returns when it reaches it."""


@dataclass
class _Entry:
    stream: RequestStream
    tracker: DeltaTracker
    arrival: float
    last_token: float | None = None
    num_generated: int = 0


class AsyncEngineClient:
    """Runs `engine` on a thread named after `stage` (the label of its metrics)."""

    produces: tuple[str, ...] = ("text",)
    multiple_samples = True
    reports_logprobs = True
    input_modalities: frozenset[str] = frozenset()
    draws = False
    speaks = False
    other_endpoints = "no other generating endpoint"
    default_sampling: Mapping[str, Any] = {"max_tokens": None}
    """A chat without max_tokens generates until the context ends, as OpenAI's does."""

    def __init__(
        self, engine: LLMEngine, stage: str = "llm", observer: EngineObserver | None = None
    ) -> None:
        self.engine = engine
        self.stage = stage
        self.observer = observer
        self.max_model_len: int = engine.config.max_model_len
        self._commands: queue.SimpleQueue[Callable[[], None] | object] = queue.SimpleQueue()
        self._entries: dict[str, _Entry] = {}  # engine thread only
        self._token_texts = TokenTexts(engine.tokenizer)
        self._stats = EngineStats(kv_blocks_total=engine.num_usable_kv_blocks())
        self._pending_adds: set[concurrent.futures.Future[list[int]]] = set()
        """Adds not yet taken by the engine thread; whoever removes one resolves it."""
        self._stopping = False
        self._dead: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"engine-{stage}", daemon=True)

    @property
    def tokenizer(self) -> Any:
        """The engine's tokenizer. Render chat templates with it on any thread; encode and
        decode happen on the engine thread."""
        return self.engine.tokenizer

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self._dead is None and not self._stopping

    def health_report(self) -> dict[str, Any]:
        return {"status": "ok"}  # one engine: alive is whole

    def start(self) -> None:
        if not self._thread.is_alive():
            self._thread.start()

    def observe(self, observer: EngineObserver) -> None:
        self.observer = observer
        observer.track_stage(self.stage, self.stats)

    def refresh_stage_stats(self) -> None:
        """Nothing to ask: the engine thread publishes its stats after every step."""

    def check_voice(self, voice: str | None, param: str) -> None:
        return None  # never asked: a text model produces no audio

    def render_chat(
        self, messages: list[dict[str, Any]], chat_template_kwargs: Any = None
    ) -> ChatPrompt:
        """The prompt text: `messages` (text only) through the model's chat template."""
        from omnistage.multimodal.request_chat import render_request_chat

        return ChatPrompt(
            render_request_chat(
                self.engine.tokenizer, messages, chat_template_kwargs=chat_template_kwargs
            ).prompt
        )

    def stats(self) -> EngineStats:
        """The latest snapshot (cheap; may predate commands still queued)."""
        return self._stats

    def fresh_stats(self, timeout: float = 10.0) -> EngineStats:
        """A snapshot taken after every command sent before this call ran (blocks: call it
        from a thread other than the event loop, e.g. in tests)."""
        done: concurrent.futures.Future[EngineStats] = concurrent.futures.Future()

        def snapshot() -> None:
            self._publish_stats()
            done.set_result(self._stats)

        self._commands.put(snapshot)
        return done.result(timeout)

    # -- the event loop's side ----------------------------------------------------------------
    async def add_request(
        self,
        prompt: str | list[int] | ChatPrompt,
        params: SamplingParams,
        request_id: str | None = None,
        add_special_tokens: bool = True,
        clamp_max_tokens: bool = False,
        *,
        modalities: Sequence[str] = ("text",),
        voice: str | None = None,
        draw: Any = None,
    ) -> RequestStream:
        """Tokenize (a str; a rendered chat without special tokens), validate and add a
        request; returns its stream. `modalities`, `voice` and `draw`: text is all it
        writes (`plan_chat` refuses the others before they get here).

        Raises the engine's ValueError for bad input, and ValueError("max_tokens: ...")
        when the prompt plus `params.max_tokens` exceeds the context, unless
        `clamp_max_tokens` (then the engine generates what fits). EngineDeadError when
        the engine no longer runs."""
        if isinstance(prompt, ChatPrompt):
            prompt, add_special_tokens = prompt.prompt, False  # the template wrote them
        self._check_alive()
        stream = RequestStream(request_id or uuid.uuid4().hex, self)
        done: concurrent.futures.Future[list[int]] = concurrent.futures.Future()
        self._pending_adds.add(done)
        self._commands.put(
            lambda: self._add(stream, prompt, params, add_special_tokens, clamp_max_tokens, done)
        )
        if not self._thread.is_alive():  # it ended meanwhile: nobody will take the add
            self._fail_pending_adds()
        try:
            stream.prompt_token_ids = await asyncio.wrap_future(done)
        except asyncio.CancelledError:
            self.abort(stream.request_id)  # runs after the add, whatever it did
            raise
        return stream

    def abort(self, request_id: str) -> None:
        """Abort a request (thread-safe, returns at once; unknown ids are ignored)."""
        self._commands.put(lambda: self._abort(request_id))

    def abort_all(self) -> None:
        """End every request now: each stream gets a last delta with finish_reason "abort"."""
        self._commands.put(self._abort_all)

    def begin_shutdown(self) -> None:
        """Refuse new requests (EngineDeadError) and abort every running one; the thread
        keeps running until `shutdown`."""
        self._stopping = True
        self._commands.put(self._abort_all)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Abort every request, stop the thread and shut the engine down (idempotent)."""
        if self._thread.is_alive():
            self.begin_shutdown()
            self._commands.put(_STOP)
            self._thread.join(timeout)
        elif self._thread.ident is None:  # never started
            self.engine.shutdown()

    def _fail_pending_adds(self) -> None:
        while True:
            try:
                done = self._pending_adds.pop()
            except KeyError:
                return
            if done.set_running_or_notify_cancel():
                done.set_exception(EngineDeadError(self._dead or "the engine stopped"))

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(self._dead)
        if self._stopping or not self._thread.is_alive():
            raise EngineDeadError("the engine is not running (the server is shutting down)")

    # -- the engine thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                busy = self.engine.has_unfinished_requests()
                try:
                    command = self._commands.get(block=not busy)
                except queue.Empty:
                    command = None
                while command is not None:
                    if command is _STOP:
                        return
                    command()  # type: ignore[operator]
                    try:
                        command = self._commands.get_nowait()
                    except queue.Empty:
                        command = None
                if self.engine.has_unfinished_requests():
                    self._step()
                self._publish_stats()
        except Exception as exc:  # a failed engine fails every request, loudly
            logger.exception("engine thread failed")
            # The log has it all; clients get no traceback (a runner worker's carries one).
            self._dead = "the engine failed: " + public_text(f"{type(exc).__name__}: {exc}")
            for entry in self._entries.values():
                entry.stream._put(EngineDeadError(self._dead))
            self._entries.clear()
        finally:
            self._fail_pending_adds()
            with contextlib.suppress(Exception):
                self.engine.shutdown()

    def _add(
        self,
        stream: RequestStream,
        prompt: str | list[int],
        params: SamplingParams,
        add_special_tokens: bool,
        clamp_max_tokens: bool,
        done: concurrent.futures.Future[list[int]],
    ) -> None:
        try:
            self._pending_adds.remove(done)
        except KeyError:
            return  # already failed (the engine is stopping)
        if not done.set_running_or_notify_cancel():
            return  # the caller went away before its request was added
        try:
            if isinstance(prompt, str):
                text, ids = (
                    prompt,
                    self.engine.tokenizer.encode(prompt, add_special_tokens=add_special_tokens),
                )
            else:
                text, ids = None, list(prompt)
            room = self.max_model_len - len(ids)
            if params.max_tokens is not None and params.max_tokens > room and not clamp_max_tokens:
                self.engine.inputs.validate_ids(ids)  # a prompt with no room at all says so
                raise ValueError(
                    f"max_tokens: the prompt ({len(ids)} tokens) plus max_tokens "
                    f"({params.max_tokens}) exceeds the context length of {self.max_model_len} "
                    f"tokens; at most {room} tokens can be generated"
                )
            self.engine.add_tokenized_request(stream.request_id, text, ids, params)
        except Exception as exc:
            done.set_exception(exc)
            return
        tracker = DeltaTracker(stream.request_id, params, self._token_texts)
        self._entries[stream.request_id] = _Entry(stream, tracker, time.perf_counter())
        done.set_result(ids)

    def _abort(self, request_id: str) -> None:
        entry = self._entries.pop(request_id, None)
        if entry is not None:
            self.engine.abort_request(request_id)
            self._observe_finished(entry, "abort")

    def _abort_all(self) -> None:
        for request_id, entry in list(self._entries.items()):
            self.engine.abort_request(request_id)
            delta = entry.tracker.aborted(len(entry.stream.prompt_token_ids))
            entry.stream._put(delta)
            self._observe_finished(entry, "abort")
        self._entries.clear()

    def _step(self) -> None:
        outputs = self.engine.step()
        now = time.perf_counter()
        for output in outputs:
            entry = self._entries.get(output.request_id)
            if entry is None:
                continue
            delta = entry.tracker.update(output)
            if delta is None:
                continue
            self._observe_tokens(entry, delta, now)
            if delta.finished:
                del self._entries[output.request_id]
                reasons = [s.finish_reason for s in delta.sequences if s.finish_reason]
                self._observe_finished(entry, reasons[-1] if reasons else "stop")
            entry.stream._put(delta)

    def _observe_tokens(self, entry: _Entry, delta: RequestDelta, now: float) -> None:
        new = sum(len(s.token_ids) for s in delta.sequences)
        if not new:
            return
        entry.num_generated += new
        if self.observer is not None:
            if entry.last_token is None:
                self.observer.on_first_token(self.stage, now - entry.arrival)
            else:
                self.observer.on_inter_token(self.stage, now - entry.last_token)
        entry.last_token = now

    def _observe_finished(self, entry: _Entry, reason: str) -> None:
        if self.observer is not None:
            self.observer.on_finished(
                self.stage,
                reason,
                len(entry.stream.prompt_token_ids),
                entry.num_generated,
                time.perf_counter() - entry.arrival,
            )

    def _publish_stats(self) -> None:
        scheduler = self.engine.core.scheduler
        kv = self.engine.kv_cache_manager
        total = self.engine.num_usable_kv_blocks()
        self._stats = EngineStats(
            num_waiting=len(scheduler.waiting),
            num_running=len(scheduler.running),
            num_unfinished=self.engine.num_unfinished_requests,
            kv_blocks_used=total - kv.num_free_blocks,
            kv_blocks_total=total,
            spec_decode=scheduler.spec_stats.copy() if scheduler.num_spec_tokens else None,
        )
