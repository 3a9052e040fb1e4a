"""`omnistage bench soak`'s workload: a seeded, reproducible mix of requests.

Each request is a function of (`--seed`, its kind, its index) only, so every mode's
server gets the very same requests and a request's output can be compared across
modes by its key (`text-17`, `omni-3`, `image-40`). Kinds:

- `text`: chat or completions on the text model; greedy or seeded random sampling
  (temperature, top-p / top-k), streamed or whole; 4-48 tokens.
- `omni`: a chat on demo-omni asking for text and speech (`modalities: [text, audio]`,
  16-bit PCM), always seeded (its talker samples), streamed or whole; 2-10 text tokens.
- `image`: an image generation on demo-image (32x32 or 64x64, 1-2 denoising steps,
  seeded), whole answers only (the endpoint does not stream).

`--abort-fraction` of the requests (drawn per request) are given up by the client: a
streamed one disconnects after 1-4 events, a whole one closes its connection 5-150 ms
after sending (usually before the answer; when the answer wins the race it is still
not compared, as its fate depends on timing).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from omnistage.benchmarks.serve import WORDS

KINDS = ("text", "omni", "image")
PATHS = {"chat": "chat/completions", "completions": "completions", "image": "images/generations"}


@dataclasses.dataclass(frozen=True)
class SoakRequest:
    """One request of the workload, the same in every mode."""

    key: str
    """`<kind>-<index>`: names the request's output across modes."""
    kind: str
    path: str
    """Under the server's `/v1/`."""
    body: dict[str, Any]
    stream: bool
    abort: str | None = None
    """None (read the whole answer), `disconnect` (a stream, after `abort_events` events)
    or `close` (a whole answer, `abort_after_s` after sending)."""
    abort_events: int = 0
    abort_after_s: float = 0.0


def make_workload(
    counts: dict[str, int], seed: int, abort_fraction: float, model: dict[str, str]
) -> list[SoakRequest]:
    """`counts[kind]` requests of each kind, interleaved in a seeded order; `model[kind]`
    is the name the kind's server answers to."""
    makers = {"text": _text, "omni": _omni, "image": _image}
    requests = []
    for kind, count in counts.items():
        for i in range(count):
            rng = random.Random(f"soak:{seed}:{kind}:{i}")
            body, stream = makers[kind](rng)
            path = PATHS[
                "image" if kind == "image" else "chat" if "messages" in body else "completions"
            ]
            request = SoakRequest(f"{kind}-{i}", kind, path, body | {"model": model[kind]}, stream)
            requests.append(_with_abort(request, rng, abort_fraction))
    random.Random(f"soak-order:{seed}").shuffle(requests)
    return requests


def _words(rng: random.Random, low: int, high: int) -> str:
    vocabulary = WORDS.split()
    return " ".join(rng.choices(vocabulary, k=rng.randint(low, high)))


def _sampling(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.5:
        return {"temperature": 0.0}
    params: dict[str, Any] = {
        "temperature": rng.choice((0.7, 1.0, 1.3)),
        "seed": rng.randrange(2**31),
    }
    if rng.random() < 0.5:
        params["top_p"] = rng.choice((0.8, 0.95))
    else:
        params["top_k"] = rng.choice((5, 20, 50))
    return params


def _text(rng: random.Random) -> tuple[dict[str, Any], bool]:
    stream = rng.random() < 0.5
    body: dict[str, Any] = {"max_tokens": rng.randint(4, 48), **_sampling(rng)}
    if rng.random() < 0.5:
        body["messages"] = [{"role": "user", "content": _words(rng, 2, 30)}]
    else:
        body["prompt"] = _words(rng, 2, 30)
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body, stream


def _omni(rng: random.Random) -> tuple[dict[str, Any], bool]:
    stream = rng.random() < 0.5
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": _words(rng, 2, 12)}],
        "modalities": ["text", "audio"],
        "audio": {"format": "pcm16", "voice": "ethan"},
        "max_tokens": rng.randint(2, 10),
        "seed": rng.randrange(2**31),
    }
    if stream:
        body["stream"] = True
    return body, stream


def _image(rng: random.Random) -> tuple[dict[str, Any], bool]:
    side = rng.choice((32, 32, 32, 64))
    body = {
        "prompt": _words(rng, 2, 10),
        "size": f"{side}x{side}",
        "response_format": "b64_json",
        "num_inference_steps": rng.randint(1, 2),
        "seed": rng.randrange(2**31),
    }
    return body, False


def _with_abort(request: SoakRequest, rng: random.Random, fraction: float) -> SoakRequest:
    if rng.random() >= fraction:
        return request
    if request.stream:
        return dataclasses.replace(request, abort="disconnect", abort_events=rng.randint(1, 4))
    return dataclasses.replace(request, abort="close", abort_after_s=rng.uniform(0.005, 0.15))
