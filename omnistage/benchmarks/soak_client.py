"""`omnistage bench soak`'s client: sends the workload to one server with a fixed number
in flight, gives up the requests the workload says to, and reduces every completed
answer to a digest that can be compared across modes.

What is compared (`record`): the text (chat content, or a completion's text; in a
stream the deltas joined, so chunk boundaries do not matter), the finish reason, the
completion tokens of `usage`, the SHA-256 of the audio (base64-decoded PCM, a stream's
chunks joined) and of each image (the decoded PNG bytes) with its revised prompt.
A request fails on an HTTP status other than 200, an `error` event in a stream or a
transport error; its error message is its record. A given-up request is never
recorded (`aborted`).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from omnistage.benchmarks.soak_workload import SoakRequest

if TYPE_CHECKING:  # imported where used, so the CLI starts without httpx installed
    import httpx


@dataclasses.dataclass
class Outcome:
    """One request's end as the client saw it."""

    key: str
    status: str
    """`completed`, `aborted` (given up by the client) or `error`."""
    digest: str | None = None
    record: dict[str, Any] | None = None
    error: str | None = None
    raced: bool = False
    """Given up, but the whole answer had arrived first."""


@dataclasses.dataclass
class _Answer:
    """What a completed answer is reduced to; `record()` is what modes must agree on."""

    text: list[str] = dataclasses.field(default_factory=list)
    transcript: list[str] = dataclasses.field(default_factory=list)
    audio: bytearray = dataclasses.field(default_factory=bytearray)
    images: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int | None = None

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": "".join(self.text), "finish": self.finish_reason}
        out["tokens"] = self.completion_tokens
        if self.transcript:
            out["transcript"] = "".join(self.transcript)
        if self.audio:
            out["audio_sha256"] = hashlib.sha256(self.audio).hexdigest()
            out["audio_bytes"] = len(self.audio)
        if self.images:
            out["images"] = self.images
        return out


def digest(record: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:32]


def _failed(key: str, message: str) -> Outcome:
    """An error answer: compared across modes like any other (a request that fails the
    same way in every mode is the server's answer to it, not a scheduling difference)."""
    record = {"error": message}
    return Outcome(key, "error", digest(record), record, error=message)


def _take_choice(answer: _Answer, choice: dict[str, Any], delta_key: str) -> None:
    """A whole answer's (`message`) or a stream chunk's (`delta`) first choice."""
    part = choice.get(delta_key) or {}
    text = choice.get("text") if "text" in choice else part.get("content")
    if text:
        answer.text.append(text)
    audio = part.get("audio") or {}
    if audio.get("data"):
        answer.audio += base64.b64decode(audio["data"])
    if audio.get("transcript"):
        answer.transcript.append(audio["transcript"])
    if choice.get("finish_reason"):
        answer.finish_reason = choice["finish_reason"]


def _take_whole(answer: _Answer, body: dict[str, Any]) -> None:
    if "choices" in body:
        _take_choice(answer, body["choices"][0], "message")
    for item in body.get("data") or []:
        png = hashlib.sha256(base64.b64decode(item["b64_json"])).hexdigest()
        answer.images.append((png, item.get("revised_prompt") or ""))
    answer.completion_tokens = (body.get("usage") or {}).get("completion_tokens")


async def _read_stream(response: httpx.Response, request: SoakRequest) -> Outcome:
    answer, events = _Answer(), 0
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        if (data := line[5:].strip()) == "[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            return _failed(request.key, _message(chunk))
        if chunk.get("choices"):
            _take_choice(answer, chunk["choices"][0], "delta")
        if usage := chunk.get("usage"):
            answer.completion_tokens = usage.get("completion_tokens")
        events += 1
        if request.abort == "disconnect" and events >= request.abort_events:
            return Outcome(request.key, "aborted")  # leaving the block drops the connection
    if request.abort is not None:
        return Outcome(request.key, "aborted", raced=True)
    record = answer.record()
    return Outcome(request.key, "completed", digest(record), record)


def _message(body: Any) -> str:
    err = body.get("error", body) if isinstance(body, dict) else body
    return str(err.get("message", err) if isinstance(err, dict) else err)[:200]


async def _exchange(client: httpx.AsyncClient, request: SoakRequest) -> Outcome:
    async with client.stream("POST", request.path, json=request.body) as response:
        if response.status_code != 200:
            raw: Any = await response.aread()
            try:
                raw = json.loads(raw)
            except ValueError:
                raw = raw.decode(errors="replace")
            return _failed(request.key, f"HTTP {response.status_code}: {_message(raw)}")
        if request.stream:
            return await _read_stream(response, request)
        body = json.loads(await response.aread())
    if request.abort is not None:
        return Outcome(request.key, "aborted", raced=True)
    answer = _Answer()
    _take_whole(answer, body)
    record = answer.record()
    return Outcome(request.key, "completed", digest(record), record)


async def send(client: httpx.AsyncClient, request: SoakRequest) -> Outcome:
    """One request; never raises. A `close` request is cancelled `abort_after_s` after it
    starts, which closes its connection (the server sees the client go). A request to
    be given up that fails first is `aborted` too (`raced`, its error kept): like an
    answer that wins the race, whether it comes depends on timing."""
    try:
        if request.abort == "close":
            try:
                outcome = await asyncio.wait_for(_exchange(client, request), request.abort_after_s)
            except TimeoutError:
                return Outcome(request.key, "aborted")
        else:
            outcome = await _exchange(client, request)
    except Exception as exc:  # one request's failure is a finding, never the run's end
        outcome = _failed(request.key, f"{type(exc).__name__}: {exc}".removesuffix(": ")[:200])
    if request.abort is not None and outcome.status == "error":
        return Outcome(request.key, "aborted", error=outcome.error, raced=True)
    return outcome


async def run_load(
    base_url: str,
    requests: Sequence[SoakRequest],
    concurrency: int,
    on_done: Callable[[Outcome], None] | None = None,
    timeout: float = 600.0,
) -> list[Outcome]:
    """Every request, `concurrency` in flight, a new one as soon as one ends; outcomes
    in the workload's order. The client's connections are all closed on return."""
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    outcomes: list[Outcome | None] = [None] * len(requests)
    queue = iter(enumerate(requests))

    async def worker(client: httpx.AsyncClient) -> None:
        for index, request in queue:  # one iterator shared: each request taken once
            outcomes[index] = outcome = await send(client, request)
            if on_done is not None:
                on_done(outcome)

    async with httpx.AsyncClient(
        base_url=base_url.rstrip("/") + "/", timeout=timeout, limits=limits, trust_env=False
    ) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return [o for o in outcomes if o is not None]
