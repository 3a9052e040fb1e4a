"""`omnistage bench serve` against a fake OpenAI-compatible streaming server on loopback.

The fake (a threaded `http.server`) answers `/v1/chat/completions` and
`/v1/completions` with canned SSE: a first chunk after `FIRST` seconds, then
`TOKENS - 1` more every `GAP` seconds, a finish chunk, a usage chunk and `[DONE]`;
`/v1/audio/speech` with a WAV header and PCM in chunks. `Fake.fail_every` makes every
k-th request a 500 (even ones) or a mid-stream `error` event (odd ones).
"""

from __future__ import annotations

import base64
import json
import shlex
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.process_helpers import free_port

# omnistage is imported inside the tests: `--launch`'s test runs `serve_fake` from this
# module in a subprocess, which should start in well under a second.
pytest.importorskip("httpx")

FIRST, GAP, TOKENS = 0.05, 0.005, 8
SAMPLE_RATE, AUDIO_CHUNKS, AUDIO_CHUNK_BYTES = 8000, 4, 4000  # 1 s of 16-bit audio


class Fake(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # no content length: the stream ends when we close
    fail_every = 0
    seen = 0
    bodies: list[dict] = []
    lock = threading.Lock()

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        body = {"data": [{"id": "fake-model", "object": "model"}]} if "models" in self.path else {}
        self._reply(200, body)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with Fake.lock:
            Fake.seen += 1
            n = Fake.seen
            Fake.bodies.append(body)
        if Fake.fail_every and n % Fake.fail_every == 0 and (n // Fake.fail_every) % 2:
            return self._reply(500, {"error": {"message": "boom", "type": "server_error"}})
        self.send_response(200)
        self.end_headers()
        time.sleep(FIRST)
        if self.path.endswith("/audio/speech"):
            return self._speech()
        if Fake.fail_every and n % Fake.fail_every == 0:
            return self._event({"error": {"message": "stage died", "code": 500}})
        for i in range(TOKENS):
            if i:
                time.sleep(GAP)
            self._event(self._chunk(body, f"w{i} ", None))
        self._event(self._chunk(body, "", "length"))
        self._event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": TOKENS}})
        self.wfile.write(b"data: [DONE]\n\n")

    def _chunk(self, body: dict, text: str, finish: str | None) -> dict:
        if "messages" not in body:
            return {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
        delta = {"content": text}
        if text and "audio" in body.get("modalities", []):
            delta["audio"] = {"data": base64.b64encode(bytes(AUDIO_CHUNK_BYTES)).decode()}
        return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    def _speech(self):
        header = b"RIFF\xff\xff\xff\xffWAVEfmt " + (16).to_bytes(4, "little") + bytes(16)
        self.wfile.write(header + b"data\xff\xff\xff\xff")
        self.wfile.flush()
        for _ in range(AUDIO_CHUNKS):
            time.sleep(GAP)
            self.wfile.write(bytes(AUDIO_CHUNK_BYTES))
            self.wfile.flush()

    def _event(self, payload: dict):
        self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
        self.wfile.flush()

    def _reply(self, status: int, body: dict):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default 5 drops connections when 64 open at once


def serve_fake(port: int) -> None:
    """The fake as a server process (for `--launch`): until SIGINT, then a clean exit."""
    server = FakeServer(("127.0.0.1", port), Fake)
    signal.signal(signal.SIGINT, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


@pytest.fixture
def fake_url():
    Fake.fail_every, Fake.seen, Fake.bodies = 0, 0, []
    server = FakeServer(("127.0.0.1", 0), Fake)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _bench(capsys, *argv: str) -> tuple[int, dict, str]:
    from omnistage.entrypoints.cli import main

    code = main(["bench", "serve", *argv])
    out = capsys.readouterr().out
    return code, json.loads(out.strip().splitlines()[-1]), out


def test_chat_numbers_at_two_concurrency_levels(fake_url, capsys):
    from omnistage.benchmarks import serve

    code, summary, out = _bench(capsys, "--base-url", fake_url, "--concurrency", "1,4")
    assert code == 0 and summary["all_succeeded"] and "ttft" in out
    assert "fake-model" in summary["workload"]  # found through GET /models
    one, four = summary["levels"]
    assert (one["concurrency"], four["concurrency"]) == (1, 4)
    assert (one["num_prompts"], four["num_prompts"]) == (16, 16)  # 2x level, at least 16
    for row in (one, four):
        assert (row["completed"], row["failed"], row["errors"]) == (16, 0, {})
        assert row["total_output_tokens"] == 16 * TOKENS  # from usage
        assert row["requests_without_usage"] == 0
        assert row["ttft_p50_ms"] >= 1000 * FIRST
        for name in ("ttft", "tpot", "itl", "e2e"):
            assert row[f"{name}_p50_ms"] <= row[f"{name}_p90_ms"] <= row[f"{name}_p99_ms"]
        assert 1000 * GAP * 0.8 <= row["itl_p50_ms"] < 1000 * FIRST
        assert row["e2e_p50_ms"] >= 1000 * (FIRST + (TOKENS - 1) * GAP)
        assert row["output_token_throughput"] == pytest.approx(
            row["total_output_tokens"] / row["wall_s"], rel=0.01
        )
    # Four in flight finish 16 requests in about a quarter of one at a time's wall time.
    assert four["request_throughput"] > 2.5 * one["request_throughput"]
    sent = Fake.bodies[-1]
    assert sent["stream"] and sent["stream_options"] == {"include_usage": True}
    assert sent["max_tokens"] == 128 and sent["temperature"] == 0
    asked = sent["messages"][0]["content"]
    assert (
        asked.startswith(serve.CHAT_ASK) and len(asked.removeprefix(serve.CHAT_ASK).split()) == 64
    )


def test_failures_are_counted_and_the_exit_status_says_so(fake_url, capsys):
    Fake.fail_every = 4  # after the warm-up (request 1): requests 4, 8, 12, 16 of 17
    argv = ["--base-url", fake_url, "--concurrency", "2", "--num-prompts", "16"]
    code, summary, out = _bench(capsys, *argv, "--endpoint", "completions")
    (row,) = summary["levels"]
    assert code == 1 and not summary["all_succeeded"]
    assert (row["completed"], row["failed"]) == (12, 4)
    assert row["errors"] == {"HTTP 500: boom": 2, "stage died": 2}
    assert row["total_output_tokens"] == 12 * TOKENS
    assert "prompt" in Fake.bodies[-1] and "failed at 2: 2 x HTTP 500: boom" in out


def test_request_rate_sends_poisson_arrivals(fake_url, capsys):
    argv = ["--base-url", fake_url, "--request-rate", "200", "--num-prompts", "20"]
    code, summary, _ = _bench(capsys, *argv, "--model", "m", "--max-tokens", "4")
    (row,) = summary["levels"]
    assert code == 0 and row["concurrency"] is None and row["request_rate"] == 200
    assert row["completed"] == 20 and "Poisson arrivals at 200" in summary["workload"]
    assert Fake.bodies[-1]["model"] == "m" and Fake.bodies[-1]["max_tokens"] == 4


def test_speech_reports_time_to_first_audio_and_real_time_factor(fake_url, capsys):
    argv = ["--base-url", fake_url, "--endpoint", "speech", "--concurrency", "2"]
    code, summary, _ = _bench(capsys, *argv, "--sample-rate", str(SAMPLE_RATE))
    (row,) = summary["levels"]
    assert code == 0 and row["completed"] == 16
    assert row["audio_s"] == pytest.approx(16 * AUDIO_CHUNKS * AUDIO_CHUNK_BYTES / 2 / SAMPLE_RATE)
    assert row["ttfa_p50_ms"] >= 1000 * FIRST and row["ttft_mean_ms"] is None
    assert row["rtf_p50"] == pytest.approx(row["e2e_p50_ms"] / 1000, rel=0.2)  # 1 s of audio
    assert Fake.bodies[-1]["stream"] and "input" in Fake.bodies[-1]


def test_chat_audio_deltas_count_as_audio(fake_url, capsys):
    argv = ["--base-url", fake_url, "--concurrency", "4", "--modalities", "text,audio"]
    code, summary, _ = _bench(capsys, *argv, "--sample-rate", str(SAMPLE_RATE))
    (row,) = summary["levels"]
    assert code == 0 and row["completed"] == 16 and row["total_output_tokens"] == 16 * TOKENS
    assert row["audio_s"] == pytest.approx(16 * TOKENS * AUDIO_CHUNK_BYTES / 2 / SAMPLE_RATE)
    assert row["ttfa_p50_ms"] >= 1000 * FIRST and row["rtf_p50"] > 0
    assert Fake.bodies[-1]["modalities"] == ["text", "audio"]
    assert Fake.bodies[-1]["audio"] == {"format": "pcm16"}


def test_percentiles_and_wav_header():
    from omnistage.benchmarks.serve_report import percentile
    from omnistage.benchmarks.serve_requests import wav_header_len

    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([1, 2, 3, 4, 5], 90) == pytest.approx(4.6)
    header = b"RIFF\x00\x00\x00\x00WAVEfmt " + (16).to_bytes(4, "little") + bytes(16)
    assert wav_header_len(header + b"data\x00\x00\x00\x00" + bytes(10)) == 44
    assert wav_header_len(header) == len(header)  # samples not there yet
    assert wav_header_len(bytes(10)) == 0


def test_bad_flags_are_named(capsys):
    from omnistage.entrypoints.cli import main

    assert main(["bench", "serve", "--concurrency", "0"]) == 2
    assert "--concurrency" in capsys.readouterr().err
    assert main(["bench", "serve", "--extra-body", "[1]"]) == 2
    assert "--extra-body" in capsys.readouterr().err


def test_launch_starts_the_server_waits_for_health_and_stops_it(monkeypatch, capsys, tmp_path):
    stopped = tmp_path / "stopped"
    script = (  # `serve --host H --port P` as the fake; it leaves a file once stopped
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "from test_bench_serve import serve_fake; "
        "serve_fake(int(sys.argv[sys.argv.index('--port') + 1])); "
        f"open({str(stopped)!r}, 'w').close()"
    )
    monkeypatch.setattr("omnistage.benchmarks.serve.SERVE_COMMAND", [sys.executable, "-c", script])
    argv = ["--base-url", f"http://127.0.0.1:{free_port()}/v1", "--launch", "--concurrency", "1"]
    code, summary, _ = _bench(capsys, *argv, "--num-prompts", "2", "--launch-timeout", "20")
    assert code == 0 and summary["levels"][0]["completed"] == 2
    assert "launched here" in summary["machine"] and stopped.exists()  # stopped by SIGINT


def test_launch_without_a_serve_command_errors_clearly(monkeypatch, capsys):
    from omnistage.entrypoints.cli import main

    fail = "import sys; sys.exit(\"omnistage: error: argument command: invalid choice: 'serve'\")"
    monkeypatch.setattr("omnistage.benchmarks.serve.SERVE_COMMAND", [sys.executable, "-c", fail])
    argv = ["bench", "serve", "--launch", "--base-url", f"http://127.0.0.1:{free_port()}/v1"]
    assert main(argv) == 2
    assert "no `serve` command" in capsys.readouterr().err


def test_launch_refuses_a_port_already_in_use(fake_url, capsys):
    from omnistage.entrypoints.cli import main

    assert main(["bench", "serve", "--launch", "--base-url", fake_url]) == 2
    assert "already listens" in capsys.readouterr().err and Fake.seen == 0


def test_peer_is_measured_first_under_the_same_load_and_compared(monkeypatch, capsys, tmp_path):
    """`--peer command`: the peer (a fake) on its own port, then ours (a fake too); the
    summary holds both servers' levels and ours / the peer's."""
    fake = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "from test_bench_serve import serve_fake; "
        "serve_fake(int(sys.argv[sys.argv.index('--port') + 1]))"
    )
    monkeypatch.setattr("omnistage.benchmarks.serve.SERVE_COMMAND", [sys.executable, "-c", fake])
    port = free_port()
    peer = f"{sys.executable} -c {shlex.quote(fake)} --host {{host}} --port {{port}}"
    argv = ["--base-url", f"http://127.0.0.1:{port}/v1", "--launch", "--concurrency", "1"]
    argv += ["--num-prompts", "2", "--launch-timeout", "20", "--peer", "command"]
    argv += ["--peer-command", peer, "--peer-port", str(free_port())]
    code, summary, out = _bench(capsys, *argv)
    assert code == 0 and summary["levels"][0]["completed"] == 2
    assert summary["peer"]["levels"][0]["completed"] == 2
    assert summary["peer"]["levels"][0]["output_token_throughput"] > 0
    compared = summary["peer"]["ratios"]  # ours / the peer's per level, then the targets
    assert compared[0]["concurrency"] == 1 and compared[0]["tpot_p50_ms_ratio"] > 0
    assert "c1_tpot_at_most_peer" in summary["peer"]["targets"] and "ours / python" in out


def test_peer_flags_are_checked_before_anything_starts(capsys, tmp_path):
    from omnistage.entrypoints.cli import main

    assert main(["bench", "serve", "--peer", "llamacpp"]) == 2
    assert "--peer: needs --launch" in capsys.readouterr().err
    argv = ["bench", "serve", "--launch", "--peer", "llamacpp", "--llama-server", "/no/such"]
    assert main(argv) == 2
    assert "--llama-server" in capsys.readouterr().err
    argv = ["bench", "serve", "--launch", "--peer", "command", "--peer-command", "x --port 1"]
    assert main(argv) == 2
    assert "--peer-command" in capsys.readouterr().err
