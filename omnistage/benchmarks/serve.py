"""`omnistage bench serve`: a load generator over HTTP for any OpenAI-compatible server.

It knows only the OpenAI HTTP API (`--base-url`, default `http://127.0.0.1:8000/v1`), so
it measures `omnistage serve`, `vllm serve` or anything else that speaks it; `--launch`
starts `omnistage serve` on the base URL's port first (waits for `/health`, stops it
with SIGINT at the end); `--peer llamacpp|command` measures a peer server first under the
same load, in the same run, and prints ours / the peer's (`serve_peer`). This module owns
the command: its flags, the workload, the launched servers and the run; `serve_requests`
sends and times the requests, `serve_report` summarizes and prints them.

Workload (seeded): per measurement `--num-prompts` distinct prompts of `--input-words`
random English words in sentences (chat: after "Continue this story at length: "), each
asking for `--max-tokens` tokens at temperature 0. OpenAI has no `ignore_eos`, so outputs
may end early: the output tokens reported are the server's `usage` (`--extra-body` adds
fields such as a server's own `ignore_eos`). Requests stream: `chat` and `completions`
send `stream: true` with `stream_options.include_usage`; `speech` posts the prompt to
`/audio/speech` with `stream: true` and reads raw audio. One warm-up request first (not
counted).

Load, one measurement per level:

- `--concurrency 1,16,64`: that many requests in flight, a new one as soon as one ends;
- `--request-rate R`: Poisson arrivals at R requests/s (inter-arrival times drawn from
  the seed), unbounded, or capped by each `--concurrency` level when given too.

Per request (times from just before it is sent): TTFT (first content chunk), ITL (gaps
between content chunks), TPOT ((e2e - TTFT) / (output tokens - 1)), e2e latency, output
tokens; for audio (the speech endpoint, or chat deltas `choices[0].delta.audio.data`,
base64) time to first audio packet (TTFA) and real-time factor (e2e / audio seconds,
16-bit mono PCM at `--sample-rate`, a WAV header skipped). A request fails on an HTTP
status other than 200, an `error` event, a transport error or a stream with no output.

Reported per level: successes / total, requests/s and output tokens/s over the level's
wall time, and mean, p50, p90, p99 of each latency. A table, then one JSON line. The exit
status is 1 when any request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from omnistage.benchmarks import serve_peer
from omnistage.benchmarks.serve_report import describe_machine, print_table, summarize
from omnistage.benchmarks.serve_requests import ENDPOINTS, run_level, send

# `--launch` runs this plus its flags; a module-level name so tests can stand in a fake.
SERVE_COMMAND = [sys.executable, "-m", "omnistage.entrypoints.cli", "serve"]
CHAT_ASK = "Continue this story at length: "
WORDS = (
    "the a of and to in is it that was for on are with as his they be at one have this "
    "from by hot word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would "
    "like so these her long make thing see him two has look more day could go come did "
    "number sound no most people my over know water than call first who may down side "
    "been now find river garden music small city light story morning window quiet road"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default=None, help="default: the first of GET /models")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="chat")
    parser.add_argument(
        "--concurrency", default=None, help="comma-separated levels (default 1,16,64)"
    )
    parser.add_argument("--request-rate", type=float, default=None, help="Poisson, requests/s")
    parser.add_argument(
        "--num-prompts", type=int, default=None, help="per level (default 2x level, >= 16)"
    )
    parser.add_argument("--input-words", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--modalities", default=None, help="chat: e.g. text,audio")
    parser.add_argument("--voice", default=None, help="audio voice (sent only when given)")
    parser.add_argument("--audio-format", choices=("pcm", "wav"), default="pcm")
    parser.add_argument("--sample-rate", type=int, default=24000, help="of the audio, Hz")
    parser.add_argument("--extra-body", default=None, help="JSON merged into every request")
    parser.add_argument("--timeout", type=float, default=600.0, help="per connect / read, s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--launch", action="store_true", help="start `omnistage serve` first")
    parser.add_argument("--serve-args", default="", help="--launch: more `serve` flags")
    parser.add_argument("--launch-timeout", type=float, default=600.0, help="for /health, s")
    serve_peer.add_arguments(parser)


def make_prompts(n: int, words: int, seed: str) -> list[str]:
    """`n` prompts of `words` random English words in sentences of 5-12 words."""
    rng, prompts, vocabulary = random.Random(seed), [], WORDS.split()
    for _ in range(n):
        out, left = [], words
        while left:
            k = min(left, rng.randint(5, 12))
            sentence = rng.choices(vocabulary, k=k)
            out.append(" ".join([sentence[0].capitalize(), *sentence[1:]]) + ".")
            left -= k
        prompts.append(" ".join(out))
    return prompts


def request_template(args: argparse.Namespace, extra: dict[str, Any]) -> dict[str, Any]:
    """Every request's body but its prompt (`with_prompt` adds it)."""
    voice = {"voice": args.voice} if args.voice else {}
    if args.endpoint == "speech":
        body = {"model": args.model, "response_format": args.audio_format, "stream": True}
        return body | voice | extra
    body = {"model": args.model, "max_tokens": args.max_tokens, "temperature": 0.0}
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    if args.modalities:
        body["modalities"] = args.modalities.split(",")
        if "audio" in body["modalities"]:
            body["audio"] = {"format": "pcm16"} | voice
    return body | extra


def with_prompt(endpoint: str, template: dict[str, Any], prompt: str) -> dict[str, Any]:
    if endpoint == "chat":  # a chat model answers bare random words briefly; ask for more
        return template | {"messages": [{"role": "user", "content": CHAT_ASK + prompt}]}
    return template | {"input" if endpoint == "speech" else "prompt": prompt}


# -- load ----------------------------------------------------------------------------------


async def measure(
    args: argparse.Namespace, levels: list[int | None], extra: dict[str, Any]
) -> list[dict[str, Any]]:
    """Find the model if not named, warm up, then one measurement per level."""
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    base = args.base_url.rstrip("/") + "/"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    # trust_env=False: no proxy from the environment between the client and the server.
    async with httpx.AsyncClient(
        base_url=base, headers=headers, timeout=args.timeout, limits=limits, trust_env=False
    ) as client:
        if args.model is None:
            try:
                args.model = (await client.get("models")).raise_for_status().json()["data"][0]["id"]
            except (httpx.HTTPError, ValueError, LookupError) as exc:
                raise ValueError(
                    f"--model: not given, and GET {base}models failed: {exc}"
                ) from None
        template = request_template(args, extra)
        warm = await send(client, args.endpoint, with_prompt(args.endpoint, template, "Hello."))
        if warm.error is not None:
            print(f"warm-up request failed: {warm.error}", file=sys.stderr)
        rows = []
        for cap in levels:
            n = args.num_prompts or max(16, 2 * (cap or 0))
            prompts = make_prompts(n, args.input_words, f"{args.seed}:{cap}:{args.request_rate}")
            bodies = [with_prompt(args.endpoint, template, p) for p in prompts]
            results, wall = await run_level(client, args, bodies, cap)
            rows.append({"concurrency": cap, "request_rate": args.request_rate, "num_prompts": n})
            rows[-1] |= summarize(results, wall, args.sample_rate)
        return rows


# -- the server, when launched -----------------------------------------------------------------
@contextlib.contextmanager
def launched(args: argparse.Namespace) -> Iterator[None]:
    """With `--launch`: `omnistage serve` on the base URL's host and port until the block
    ends (then SIGINT, as a person would stop it); without: nothing."""
    if not args.launch:
        yield
        return
    host, port = _host_port(args.base_url)
    cmd = [*SERVE_COMMAND, "--host", host, "--port", str(port)]
    cmd += ["--model", args.model] if args.model else []
    cmd += ["--api-key", args.api_key] if args.api_key else []
    cmd += shlex.split(args.serve_args)
    with running(cmd, args.base_url, args.launch_timeout):
        yield


@contextlib.contextmanager
def running(cmd: list[str], base_url: str, launch_timeout: float) -> Iterator[subprocess.Popen]:
    """`cmd`, a server for `base_url`, from its `/health` answering to the block's end
    (the block gets its process)."""
    host, port = _host_port(base_url)
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
        raise ValueError(f"--launch: something already listens on {host}:{port}")
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(proc, base_url, launch_timeout, log)
            yield proc
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _host_port(base_url: str) -> tuple[str, int]:
    url = urlsplit(base_url)
    return url.hostname or "127.0.0.1", url.port or 80


def _wait_healthy(proc: subprocess.Popen, base_url: str, launch_timeout: float, log: Any) -> None:
    import httpx

    health = base_url.rstrip("/").removesuffix("/v1") + "/health"
    deadline = time.monotonic() + launch_timeout
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(health, timeout=2.0, trust_env=False).status_code == 200:
                break
        time.sleep(0.25)
    if proc.poll() is None and time.monotonic() < deadline:
        return
    log.seek(0)
    tail = log.read().decode(errors="replace")[-2000:]
    if "invalid choice: 'serve'" in tail:
        raise ValueError("--launch: this omnistage has no `serve` command (issue 7)")
    if proc.poll() is None:
        raise ValueError(f"--launch: {health} did not answer within {launch_timeout:g} s")
    raise ValueError(
        f"--launch: `{shlex.join(proc.args)}` exited with {proc.returncode} before {health} "
        f"answered; its output ends:\n{tail}"
    )


def _workload(args: argparse.Namespace, levels: list[int | None]) -> str:
    load = (
        f"Poisson arrivals at {args.request_rate:g} requests/s (seed {args.seed}), "
        f"in flight at most {', '.join(str(c or 'unbounded') for c in levels)}"
        if args.request_rate
        else f"concurrency {', '.join(str(c) for c in levels)}"
    )
    count = args.num_prompts or "max(16, 2x level)"
    out = f", max_tokens {args.max_tokens}, temperature 0" if args.endpoint != "speech" else ""
    extra = f", extra body {args.extra_body}" if args.extra_body else ""
    return (
        f"{args.endpoint} streaming to {args.base_url}, model {args.model}, {count} prompts "
        f"per level of {args.input_words} random English words (seed {args.seed}"
        f"{'; chat: after ' + repr(CHAT_ASK) if args.endpoint == 'chat' else ''}){out}"
        f"{', modalities ' + args.modalities if args.modalities else ''}{extra}; {load}; "
        "1 warm-up request; output tokens from usage"
    )


def _levels(args: argparse.Namespace) -> list[int | None]:
    if args.concurrency is None:
        return [None] if args.request_rate else [1, 16, 64]
    try:
        levels = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise ValueError("--concurrency: expected comma-separated levels >= 1")
    return levels


def main(args: argparse.Namespace) -> int:
    levels = _levels(args)
    for name in ("num_prompts", "input_words", "max_tokens", "sample_rate"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: must be at least 1")
    if args.request_rate is not None and args.request_rate <= 0:
        raise ValueError("--request-rate: must be positive")
    try:
        extra = json.loads(args.extra_body or "{}")
    except ValueError as exc:
        raise ValueError(f"--extra-body: not JSON ({exc})") from None
    if not isinstance(extra, dict):
        raise ValueError("--extra-body: expected a JSON object")
    serve_peer.check(args)
    peer = _measure_peer(args, levels, extra) if args.peer else None
    ours_args = argparse.Namespace(**vars(args))  # `measure` names the model it found
    with launched(ours_args):
        rows = asyncio.run(measure(ours_args, levels, extra))
    workload, machine = _workload(ours_args, levels), describe_machine(args)
    print(f"workload: {workload}\nmachine: {machine}")
    summary: dict[str, Any] = {"benchmark": "serve", "workload": workload, "machine": machine}
    if peer is not None:
        name, peer_command, peer_rows = peer
        print(f"-- {name}: {peer_command}")
        print_table(peer_rows)
        print("-- omnistage")
    print_table(rows)
    summary["levels"] = rows
    failed = sum(row["failed"] for row in rows)
    if peer is not None:
        comparison = serve_peer.compare(rows, peer_rows)
        serve_peer.print_comparison(name, comparison)
        summary["peer"] = {"name": name, "command": peer_command, "levels": peer_rows}
        summary["peer"] |= comparison
        failed += sum(row["failed"] for row in peer_rows)
    print(json.dumps(summary | {"all_succeeded": failed == 0}))
    return 1 if failed else 0


def _measure_peer(
    args: argparse.Namespace, levels: list[int | None], extra: dict[str, Any]
) -> tuple[str, str, list[dict[str, Any]]]:
    """The peer server, started alone on its own port, under the same load as ours."""
    host, port = _host_port(args.base_url)
    port = args.peer_port or port + 1
    peer_args = argparse.Namespace(**vars(args))
    peer_args.base_url = f"http://{host}:{port}/v1"
    peer_args.model = None  # the peer's own name for its model
    cmd = serve_peer.command(args, host, port, levels)
    with running(cmd, peer_args.base_url, args.launch_timeout):
        rows = asyncio.run(measure(peer_args, levels, extra))
    name = "llama-server" if args.peer == "llamacpp" else Path(cmd[0]).name
    return name, shlex.join(cmd), rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
