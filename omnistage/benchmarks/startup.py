"""`omnistage bench startup`: from a fresh process to the first token.

Each run is a new process, as a user starts one (nothing is shared between
runs but the on-disk caches: the converted GGUF and the compiled kernels, which
a first-ever start builds once and every later start reuses):

- `script`: the README's example as a plain script (`LLM(model=...)`, one
  greedy token) — process start to the first token, and inside it: imports,
  `LLM(...)` (the runner worker starts first and builds the model while this
  process loads the tokenizer), the first step; the worker's own phases
  (process start and imports, config, model build, weights, weight packing).
- `serve`: `omnistage serve --model ...` — process start to `/health` answering,
  and to the first chat completion (one token) answered.
- `transformers`: HF transformers' `AutoModelForCausalLM` on the same
  checkpoint (the built-in model's converted HF directory), float32,
  `generate(max_new_tokens=1)` — process start to the first token.
- `llama.cpp` (when `--llama-server` is given, e.g. the peers' build):
  `llama-server -m GGUF` — process start to its first `/completion` answered.

Runs are interleaved (script, serve, transformers, llama.cpp, then again);
medians reported with the CPU flags; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

PROMPT = "The capital of France is"

SCRIPT = """\
import time
T0 = time.time()
from omnistage import LLM, SamplingParams
T1 = time.time()
llm = LLM(model={model!r})
T2 = time.time()
out = llm.generate([{prompt!r}], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
T3 = time.time()
import json
print("RESULT", json.dumps({{
    "first_token_at": T3, "interpreter_to_script": T0,
    "phases": {{"import omnistage": T1 - T0, "LLM(...)": T2 - T1, "first step": T3 - T2}},
    "worker": llm.engine.core.executor.startup_phases, "text": out[0].outputs[0].text,
}}), flush=True)
"""

HF_SCRIPT = """\
import time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained({path!r})
model = AutoModelForCausalLM.from_pretrained({path!r}, dtype=torch.float32)
ids = tokenizer({prompt!r}, return_tensors="pt")
out = model.generate(**ids, max_new_tokens=1, do_sample=False)
import json
print("RESULT", json.dumps({{"first_token_at": time.time(),
      "text": tokenizer.decode(out[0, ids.input_ids.shape[1]:])}}), flush=True)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="built-in name, HF dir or .gguf")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per peer")
    parser.add_argument(
        "--peers",
        default="script,serve,transformers",
        help="comma-separated: script, serve, transformers, llamacpp",
    )
    parser.add_argument("--llama-server", default=None, help="llama.cpp's llama-server binary")
    parser.add_argument("--gguf", default=None, help="GGUF file for llama-server")


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_script(source: str, cwd: Path) -> dict[str, Any]:
    path = cwd / "startup_script.py"
    path.write_text(source)
    started = time.time()
    proc = subprocess.run(
        [sys.executable, str(path)], cwd=cwd, env=_env(), capture_output=True, text=True
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{path.name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1].removeprefix("RESULT "))
    result["seconds"] = result.pop("first_token_at") - started
    if "interpreter_to_script" in result:
        result["phases"] = {
            "interpreter start": result.pop("interpreter_to_script") - started,
            **result["phases"],
        }
    return result


def _serve_like(command: list[str], health: str, request: Any) -> dict[str, float]:
    """Start a server; seconds until `health` answers 200 and until `request` is answered."""
    started = time.time()
    proc = subprocess.Popen(
        command, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        healthy = _wait_healthy(proc, health)
        request()
        answered = time.time()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"seconds": answered - started, "healthy": healthy - started}


def _wait_healthy(proc: subprocess.Popen, url: str, timeout: float = 300) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}): {proc.stderr.read()[-3000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return time.time()
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{url} not healthy within {timeout} s")


def _serve(model: str) -> dict[str, float]:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "omnistage.entrypoints.cli", "serve", "--model", model]

    def chat() -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 1,
            "temperature": 0,
        }
        httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120).raise_for_status()

    return _serve_like([*command, "--port", str(port)], f"{base}/health", chat)


def _llamacpp(server: str, gguf: str) -> dict[str, float]:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    command = [server, "-m", gguf, "-t", str(os.cpu_count() or 1), "--port", str(port)]

    def completion() -> None:
        body = {"prompt": PROMPT, "n_predict": 1, "temperature": 0}
        httpx.post(f"{base}/completion", json=body, timeout=120).raise_for_status()

    return _serve_like(command, f"{base}/health", completion)


def cpu_flags() -> list[str]:
    try:
        line = next(
            x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags")
        )
    except (OSError, StopIteration):
        return []
    wanted = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16")
    return [f for f in line.split(":", 1)[1].split() if f in wanted]


def _median_phases(results: list[dict[str, Any]], key: str) -> dict[str, float]:
    names = list(dict.fromkeys(n for r in results for n in r.get(key, {})))
    return {n: statistics.median(r[key].get(n, 0.0) for r in results) for n in names}


def main(args: argparse.Namespace) -> int:
    from omnistage.models.loader import resolve_model

    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    if "llamacpp" in peers and not (args.llama_server and args.gguf):
        raise ValueError("--peers llamacpp: give --llama-server and --gguf")
    files = resolve_model(args.model)  # builds the caches once, outside the timed runs
    results: dict[str, list[dict[str, Any]]] = {p: [] for p in peers}
    with tempfile.TemporaryDirectory(prefix="omnistage-startup-") as tmp:
        cwd = Path(tmp)
        _run_script(SCRIPT.format(model=args.model, prompt=PROMPT), cwd)  # warm-up: caches
        for run in range(args.runs):
            for peer in peers:
                if peer == "script":
                    r = _run_script(SCRIPT.format(model=args.model, prompt=PROMPT), cwd)
                elif peer == "serve":
                    r = _serve(args.model)
                elif peer == "transformers":
                    r = _run_script(HF_SCRIPT.format(path=str(files.path), prompt=PROMPT), cwd)
                elif peer == "llamacpp":
                    r = _llamacpp(args.llama_server, args.gguf)
                else:
                    raise ValueError(f"--peers: unknown peer {peer!r}")
                results[peer].append(r)
                print(f"run {run + 1} {peer:>12}: {r['seconds']:.2f} s", flush=True)
    medians = {p: statistics.median(r["seconds"] for r in rs) for p, rs in results.items()}
    summary: dict[str, Any] = {
        "bench": "startup",
        "model": args.model,
        "runs": args.runs,
        "cpu": platform.processor() or platform.machine(),
        "cpu_flags": cpu_flags(),
        "cores": os.cpu_count(),
        **{f"{p}_s": round(v, 3) for p, v in medians.items()},
    }
    if "script" in results:
        summary["script_phases_s"] = _round(_median_phases(results["script"], "phases"))
        summary["worker_phases_s"] = _round(_median_phases(results["script"], "worker"))
    if "serve" in results:
        summary["serve_healthy_s"] = round(
            statistics.median(r["healthy"] for r in results["serve"]), 3
        )
    for peer in ("transformers", "llamacpp"):
        if peer in medians and "script" in medians:
            summary[f"{peer}_over_script"] = round(medians[peer] / medians["script"], 3)
    print()
    print("| peer | median s (process start → first token) |")
    print("| --- | --- |")
    for peer, value in medians.items():
        print(f"| {peer} | {value:.2f} |")
    for key in ("script_phases_s", "worker_phases_s"):
        if key in summary:
            print(f"\n{key}: " + ", ".join(f"{k} {v:.2f}" for k, v in summary[key].items()))
    print(json.dumps(summary))
    return 0


def _round(values: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in values.items()}
