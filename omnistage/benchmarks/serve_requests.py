"""`omnistage bench serve`'s requests: one streaming request over HTTP as the client sees
it (`send` -> `Result`: TTFT, ITL, e2e, output tokens from `usage`, time to first audio,
audio bytes), and a level of them at a concurrency cap or Poisson arrivals (`run_level`).
A request's failure is recorded in its result, never raised.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import random
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used, so the CLI starts without httpx installed
    import httpx

ENDPOINTS = {"chat": "chat/completions", "completions": "completions", "speech": "audio/speech"}


@dataclasses.dataclass
class Result:
    """One request as the client saw it; times in seconds from just before it was sent."""

    error: str | None = None
    ttft: float | None = None
    itl: list[float] = dataclasses.field(default_factory=list)
    e2e: float = 0.0
    output_tokens: int = 0
    had_usage: bool = False
    ttfa: float | None = None
    audio_bytes: int = 0


def _pick(chunk: dict) -> tuple[str | None, str | None]:
    """A chat or completions chunk's new text and base64 audio."""
    choice = (chunk.get("choices") or [{}])[0]
    delta = choice.get("delta") or {}
    audio = delta.get("audio") or {}  # with audio out, OpenAI sends the text as its transcript
    text = choice.get("text") or delta.get("content") or delta.get("reasoning_content")
    return text or audio.get("transcript"), audio.get("data")


def wav_header_len(data: bytes) -> int:
    """Bytes before the samples when `data` opens with a RIFF/WAVE header (all of it while
    the `data` chunk has not arrived), else 0."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return 0
    pos = 12
    while pos + 8 <= len(data):
        if data[pos : pos + 4] == b"data":
            return pos + 8
        pos += 8 + int.from_bytes(data[pos + 4 : pos + 8], "little")
    return len(data)


async def _read_sse(response: httpx.Response, r: Result, start: float) -> None:
    last, chunks = None, 0
    async for line in response.aiter_lines():
        if not line.startswith("data:"):  # blank separators, comments, `event:` lines
            continue
        if (data := line[5:].strip()) == "[DONE]":
            break
        chunk, now = json.loads(data), time.perf_counter()
        if "error" in chunk:
            r.error = _message(chunk)
            return
        if usage := chunk.get("usage"):
            r.output_tokens, r.had_usage = int(usage.get("completion_tokens") or 0), True
        text, audio = _pick(chunk)
        if audio and (n := _pcm_len(base64.b64decode(audio))):
            r.ttfa = now - start if r.ttfa is None else r.ttfa
            r.audio_bytes += n
        if text:
            if last is None:
                r.ttft = now - start
            else:
                r.itl.append(now - last)
            last, chunks = now, chunks + 1
    if not r.had_usage:
        r.output_tokens = chunks
    if last is None and not r.audio_bytes:
        r.error = "the stream ended without any output"


def _pcm_len(data: bytes) -> int:
    return len(data) - wav_header_len(data)


async def _read_audio(response: httpx.Response, r: Result, start: float) -> None:
    head, total = b"", 0
    async for data in response.aiter_bytes():
        total, head = total + len(data), head + data[: 4096 - len(head)]
        r.audio_bytes = total - wav_header_len(head)
        if r.audio_bytes > 0 and r.ttfa is None:
            r.ttfa = time.perf_counter() - start
    if r.audio_bytes <= 0:
        r.error = "the response carried no audio"


def _message(body: Any) -> str:
    err = body.get("error", body) if isinstance(body, dict) else body
    return str(err.get("message", err) if isinstance(err, dict) else err)[:200]


async def send(client: httpx.AsyncClient, endpoint: str, body: dict[str, Any]) -> Result:
    """One streaming request; never raises (a failure is recorded in the result)."""
    r, start = Result(), time.perf_counter()
    try:
        async with client.stream("POST", ENDPOINTS[endpoint], json=body) as resp:
            if resp.status_code != 200:
                raw = await resp.aread()
                with contextlib.suppress(ValueError):
                    raw = json.loads(raw)
                r.error = f"HTTP {resp.status_code}: {_message(raw)}"
            elif endpoint == "speech":
                await _read_audio(resp, r, start)
            else:
                await _read_sse(resp, r, start)
    except Exception as exc:  # one request's failure is a data point, never the run's end
        r.error = f"{type(exc).__name__}: {exc}".removesuffix(": ")[:200]
    r.e2e = time.perf_counter() - start
    return r


async def run_level(
    client: httpx.AsyncClient, args: argparse.Namespace, bodies: list[dict], cap: int | None
) -> tuple[list[Result], float]:
    """All requests, `cap` in flight at most, arriving at `--request-rate` (Poisson) or at
    once; returns the results in prompt order and the wall time."""
    rng, arrivals, t = random.Random(f"arrivals:{args.seed}"), [], 0.0
    for _ in bodies:
        arrivals.append(t)
        t += rng.expovariate(args.request_rate) if args.request_rate else 0.0
    slots = asyncio.Semaphore(cap or len(bodies))
    start = time.perf_counter()

    async def one(body: dict, at: float) -> Result:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        async with slots:
            return await send(client, args.endpoint, body)

    results = await asyncio.gather(*(one(b, a) for b, a in zip(bodies, arrivals, strict=True)))
    return list(results), time.perf_counter() - start
