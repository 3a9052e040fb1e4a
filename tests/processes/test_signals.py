"""Ctrl-C (SIGINT) and SIGTERM end a script or `omnistage serve` quickly and cleanly:
no child process and no shared-memory segment is left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from omnistage.models.plain_config import load_config
from omnistage.pipeline.connectors.shm import namespace_segments
from tests.process_helpers import alive, descendants

EXIT_WITHIN_S = 2.0

LLM_LOOP = """\
from omnistage import LLM, SamplingParams

llm = LLM(model={model!r}, async_scheduling=True)
params = SamplingParams(max_tokens=64, ignore_eos=True)
print("READY", flush=True)
while True:
    llm.generate([{{"prompt_token_ids": [1, 2, 3]}}] * 4, params, use_tqdm=False)
"""

OMNI_LOOP = """\
from omnistage.pipeline.omni import Omni
from omnistage.testing.tiny_pipeline import tiny_pipeline_deploy

omni = Omni(tiny_pipeline_deploy({model!r}, async_scheduling=True))
print("READY", omni.orchestrator.namespace, flush=True)
while True:
    omni.generate(["hello world", "abc"])
"""


def _shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("omni_")}


def _as_in_a_terminal() -> None:
    """SIGINT as a terminal's program has it: a test runner started in the background
    (CI, a job) passes SIGINT on ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def start():
    started: list[subprocess.Popen] = []

    def start(command: list[str], cwd: Path) -> subprocess.Popen:
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_as_in_a_terminal,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:  # whatever the test's outcome, nothing keeps running
        for pid in descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


def _wait_for_line(proc: subprocess.Popen, marker: str, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if marker in line:
            return line
        if not line and proc.poll() is not None:
            raise AssertionError(
                f"exited {proc.returncode} before {marker!r}: {proc.stderr.read()}"
            )
    raise AssertionError(f"no {marker!r} within {timeout} s")


def _stop_and_check(proc: subprocess.Popen, signum: int, shm: Callable[[], set[str]]) -> float:
    """Signal `proc` mid-work; return how long it took to exit, having checked that its
    children are gone and that `shm()` (its shared-memory segments) is empty."""
    children = descendants(proc.pid)
    assert children, "the engine should run at least one child process"
    time.sleep(0.5)  # mid-work
    start = time.monotonic()
    proc.send_signal(signum)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("did not exit within 30 s") from None
    elapsed = time.monotonic() - start
    deadline = time.monotonic() + 5  # an orphan would be reparented, not reaped, at once
    while any(alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [c for c in children if alive(c)], "child processes left behind"
    assert not shm(), "shared-memory segments left behind"
    return elapsed


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_script_stops_on_a_signal_and_leaves_nothing(start, tiny_llama, tmp_path, signum):
    # A model's first start ever resolves its config through transformers (then cached:
    # models/plain_config.py), and a script that imported transformers takes ~0.5 s more
    # to tear down; the bound is for the usual start, so the config is resolved first.
    load_config(tiny_llama)
    (tmp_path / "loop.py").write_text(LLM_LOOP.format(model=str(tiny_llama)))
    proc = start([sys.executable, "loop.py"], tmp_path)
    _wait_for_line(proc, "READY")
    elapsed = _stop_and_check(proc, signum, set)
    assert elapsed <= EXIT_WITHIN_S, f"took {elapsed:.2f} s"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_pipeline_script_stops_on_a_signal_and_leaves_nothing(start, tmp_path, signum):
    from omnistage.testing.tiny_pipeline import make_tiny_omni

    model = make_tiny_omni(tmp_path / "tiny-omni")
    (tmp_path / "loop.py").write_text(OMNI_LOOP.format(model=str(model)))
    proc = start([sys.executable, "loop.py"], tmp_path)
    namespace = _wait_for_line(proc, "READY").split()[1]
    elapsed = _stop_and_check(proc, signum, lambda: set(namespace_segments(namespace)))
    assert elapsed <= EXIT_WITHIN_S, f"took {elapsed:.2f} s"


@pytest.mark.parametrize("model", ["smollm2", "demo-omni"])
def test_serve_stops_on_sigterm_and_leaves_nothing(start, tmp_path, model):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    shm_before = _shm()
    cli = [sys.executable, "-m", "omnistage.entrypoints.cli"]
    proc = start([*cli, "serve", "--model", model, "--port", str(port)], tmp_path)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    elapsed = _stop_and_check(proc, signal.SIGTERM, lambda: _shm() - shm_before)
    assert elapsed <= EXIT_WITHIN_S, f"took {elapsed:.2f} s"
