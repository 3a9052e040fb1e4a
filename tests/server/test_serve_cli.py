"""`omnistage serve` as a process: --api-key (401 without it), --served-model-name, the
slow-client timeouts, and a graceful SIGTERM that aborts the request in flight and exits cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from tests.process_helpers import free_port

KEY = "sekret"


@pytest.fixture(scope="module")
def served(tiny_llama):
    port = free_port()
    flags = f"--model {tiny_llama} --port {port} --api-key {KEY} --max-model-len 256"
    flags += " --served-model-name tiny keyed --no-async-scheduling --log-level warning"
    flags += " --header-timeout-s 1 --read-timeout-s 2 --max-connections 64"
    command = [sys.executable, "-m", "omnistage.entrypoints.cli", "serve", *flags.split()]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "OMNISTAGE_API_KEY": ""}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"omnistage serve did not start:\n{proc.stdout.read().decode()}")
        time.sleep(0.2)
    yield proc, url
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)


def test_api_key_is_required(served):
    _, url = served
    for key in ("wrong", KEY + "x"):
        with pytest.raises(openai.AuthenticationError) as info:
            _client(url, key).models.list()
        assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"
    raw = httpx.post(f"{url}/v1/chat/completions", content=b"{not json")  # no key at all
    assert raw.status_code == 401 and set(raw.json()["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }
    assert "API key" in raw.json()["error"]["message"]
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/metrics").status_code == 200


def test_with_the_key_every_served_name_answers(served):
    _, url = served
    client = _client(url, KEY)
    assert [m.id for m in client.models.list().data] == ["tiny", "keyed"]
    for name in ("tiny", "keyed"):
        out = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert out.model == name and out.usage.completion_tokens <= 3


def test_slow_client_flags_reach_the_server(served):
    """Half a header is cut after --header-timeout-s; a stalled body is a 408 after
    --read-timeout-s (tests/server/test_slow_clients.py has the details)."""
    _, url = served
    port = int(url.rsplit(":", 1)[1])
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n"
    head += f"Authorization: Bearer {KEY}\r\n".encode()
    for sent, seconds, answer in ((head[:30], 1, b""), (head + b"\r\n{", 2, b"HTTP/1.1 408")):
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(sent)
            said = b""
            while chunk := conn.recv(65536):  # until the server closes it
                said += chunk
        assert seconds - 0.2 < time.monotonic() - start < seconds + 3, sent
        assert said.startswith(answer), said


def test_sigterm_aborts_the_stream_in_flight_and_exits(served):
    proc, url = served
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 250, "stream": True, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers, timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: {")
        proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    assert '"error"' in rest[-2] and "shutting down" in rest[-2]
    assert len(rest) < 250  # it did not run to the end
    assert proc.wait(timeout=30) == 0
    output = proc.stdout.read().decode()
    assert "Traceback" not in output, output


@pytest.mark.parametrize("model", ["demo-image", "demo-omni"])
def test_the_early_text_worker_leaves_a_pipeline_to_the_server(model):
    """`serve` starts a text model's worker before the server imports; a pipeline's folder
    (demo-image has no config.json at its top) is left to the server, never a crash."""
    from omnistage.entrypoints.cli import _early_text_worker, build_parser

    args = build_parser().parse_args(["serve", "--model", model])
    assert _early_text_worker(args) is None
