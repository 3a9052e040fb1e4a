"""`omnistage bench soak`, short: over a hundred generations of text, speech and images on
real `omnistage serve` processes in sync and async + speculative mode, 20 % given up by
the client; every generation completed in both modes is identical and every counter is
back to zero. (The full soak, 20,480 generations, runs by command: docs/reliability.md.)

The other tests check the soak's own parts without servers: a perturbed answer is a
mismatch, the workload is a function of the seed, a leaked counter is named.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("httpx")

N = 64
"""Generations, both modes together: 16 text, 8 speech and 8 image requests per mode."""
SHORT = ["--generations", str(N), "--modes", "sync,spec", "--concurrency", "16"]


def test_short_soak_matches_across_modes_and_leaks_nothing(capsys, tmp_path):
    from omnistage.entrypoints.cli import main

    out = tmp_path / "soak.json"
    code = main(["bench", "soak", *SHORT, "--in-process", "--seed", "1", "--out", str(out)])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["mismatches"] == 0, summary["first_mismatches"]
    assert summary["leaks"] == {}, summary["leaks"]
    # Known, and the same in every mode (else a mismatch): a demo-omni talker that ends at
    # its first frame makes a whole chat answer a 500 (its stream just has no audio).
    assert set(summary["errors_by_message"]) <= {"HTTP 500: the pipeline produced no audio"}
    assert code == 0 and summary["ok"]
    assert summary["generations"] >= N
    assert summary["generations_per_mode"] == {"sync": N // 2, "spec": N // 2}
    assert summary["workload"]["modes"] == {k: ["sync", "spec"] for k in ("text", "omni", "image")}
    assert 0.1 * N < summary["aborts"] < 0.3 * N
    assert summary["compared"] >= 0.6 * (N // 2)  # most requests completed in both modes
    servers = {f"{kind}/{mode}" for kind in ("text", "omni", "image") for mode in ("sync", "spec")}
    assert set(summary["counters_at_end"]) == servers
    for counters in summary["counters_at_end"].values():
        assert counters["waiting"] == counters["running"] == counters["kv_usage"] == 0
        assert counters["held"] == 0  # a pipeline's resource gauges and open requests
        assert counters["shm_segments"] == 0 and counters["fds"] > 0
    for rss in summary["rss"].values():
        assert 0 < rss["start_mb"] <= rss["peak_mb"] and rss["end_mb"] <= rss["peak_mb"]
    # It speculated: the text server, demo-omni's thinker (which sends its hidden states
    # on) and demo-image's thinker.
    assert summary["speculation"]["text/spec"]["llm"]["accepted_tokens"] > 0
    assert summary["speculation"]["omni/spec"]["thinker"]["accepted_tokens"] > 0
    assert "talker" not in summary["speculation"]["omni/spec"]  # it takes no drafts
    assert summary["wall_s"] > 0 and summary["cpu"]["cores"] >= 1
    full = json.loads(out.read_text())
    assert all(len(s["rss"]["curve"]) >= 2 for s in full["servers"])
    assert {k: len(v) for k, v in full["digests"].items()} == {"text": 2, "omni": 2, "image": 2}
    omni = next(s for s in full["servers"] if s["kind"] == "omni")["counters_at_end"]["stages"]
    assert omni["orchestrator"] == {"open_requests": 0}  # read from /metrics, held counted
    assert omni["thinker"]["kv_blocks_used"] == omni["talker"]["accumulator_entries"] == 0


def _outcome(key: str, text: str):
    from omnistage.benchmarks.soak_client import Outcome, digest

    record = {"text": text, "finish": "length", "tokens": 3}
    return Outcome(key, "completed", digest(record), record)


def test_a_differing_answer_is_a_mismatch_and_a_lone_one_is_not_compared():
    from omnistage.benchmarks.soak_client import Outcome
    from omnistage.benchmarks.soak_report import compare

    sync = [_outcome("text-0", "abc"), _outcome("text-1", "xyz"), _outcome("text-2", "q")]
    spec = [_outcome("text-0", "abc"), _outcome("text-1", "xyZ"), Outcome("text-2", "aborted")]
    result = compare({"sync": sync, "spec": spec})
    assert (result["compared"], result["mismatches"]) == (2, 1)
    (first,) = result["first_mismatches"]
    assert first["key"] == "text-1" and first["spec"]["text"] == "xyZ"


def test_the_workload_is_a_function_of_the_seed():
    from omnistage.benchmarks.soak_workload import make_workload

    names = {"text": "t", "omni": "o", "image": "i"}
    counts = {"text": 200, "omni": 50, "image": 50}
    one, again = (make_workload(counts, 7, 0.2, names) for _ in range(2))
    assert one == again and one != make_workload(counts, 8, 0.2, names)
    by_key = {r.key: r for r in one}
    assert len(by_key) == 300
    aborts = sum(r.abort is not None for r in one)
    assert 0.12 * 300 < aborts < 0.28 * 300
    assert {r.abort for r in one if r.stream} == {None, "disconnect"}
    assert all(r.body.get("seed") is not None for r in one if r.kind != "text")
    text = [r for r in one if r.kind == "text"]
    assert {r.path for r in text} == {"chat/completions", "completions"}
    assert {r.body["temperature"] == 0 for r in text} == {True, False}  # greedy and sampled


def test_a_counter_left_up_is_named_a_leak():
    from omnistage.benchmarks.soak_report import leaks, server_summary

    idle = {"stages": {"llm": {"waiting": 0, "running": 0, "kv_usage": 0}}, "shm_segments": 0}
    idle |= {"speculation": {}, "fds": 10, "threads": 4, "processes": 2, "rss_mb": 1.0}
    left = idle | {"stages": {"llm": {"waiting": 0, "running": 1, "kv_usage": 0.25}}}
    left |= {"fds": 12, "shm_segments": 3}
    summary = server_summary([_outcome("text-0", "a")], 1.0, [idle, idle, left], 60.0)
    assert summary["leaks"] == {"llm.running": 1, "llm.kv_usage": 0.25, "shm_segments": 3}
    assert server_summary([], 1.0, [idle, idle, idle], 0.1)["leaks"] == {}
    # Descriptors: growing in both halves is a leak; once, then holding, is a lazy start.
    assert leaks(idle, idle | {"fds": 11}, idle | {"fds": 12}) == {"fds": 2}
    assert leaks(idle, idle | {"fds": 17}, idle | {"fds": 17}) == {}
    assert leaks(idle, idle, idle | {"processes": 3}) == {"processes": 1}
