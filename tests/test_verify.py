"""`omnistage verify` (docs/verify.md): it passes on every built-in model and demo
(`--short`; `pytest -m soak` for the full size), it fails, naming the first differing
request, stage and token position, when one configuration's engine is broken on
purpose, and bad arguments exit 2 naming the field."""

from __future__ import annotations

import json

import pytest

from omnistage.core.async_scheduler import AsyncScheduler
from omnistage.entrypoints.cli import main


def verify(capsys, *argv: str) -> tuple[int, str, dict | None]:
    """Exit status, the printed table and the final JSON line (None without one)."""
    code = main(["verify", *argv])
    out = capsys.readouterr()
    last = out.out.strip().splitlines()[-1] if out.out.strip() else ""
    return code, out.out + out.err, json.loads(last) if last.startswith("{") else None


def assert_passes(capsys, *argv: str) -> dict:
    code, text, result = verify(capsys, *argv, "--json")
    assert code == 0, text
    assert result is not None and result["ok"], text
    rows = {c["name"]: c for c in result["checks"]}
    assert rows["sync = async"]["result"] == "pass"
    assert rows["batched = alone"]["result"] == "pass"
    assert rows["nothing leaked"]["result"] == "pass"
    assert rows["sync = async"]["requests"] >= 1
    assert result["aborted"] >= 1
    return rows


def test_verify_passes_on_a_tiny_text_model(capsys, tiny_llama_f64):
    rows = assert_passes(capsys, "--model", str(tiny_llama_f64), "--short", "--dtype", "float64")
    assert rows["sync = speculative"]["result"] == "pass"


def test_verify_short_passes_on_smollm2(capsys):
    rows = assert_passes(capsys, "--model", "smollm2", "--short")
    assert rows["sync = speculative"]["result"] == "pass"


@pytest.mark.parametrize(
    ("demo", "speculates"),
    [
        ("demo-omni", True),
        ("demo-image", True),
        ("demo-qwen3-tts", False),
        ("demo-cosyvoice3", True),
        ("demo-covo-audio", True),
    ],
)
def test_verify_short_passes_on_each_demo(capsys, demo, speculates):
    rows = assert_passes(capsys, "--model", demo, "--short")
    spec = rows["sync = speculative"]
    assert spec["result"] == ("pass" if speculates else "skipped"), spec
    if not speculates:
        assert "no stage takes drafts" in spec["note"]


@pytest.mark.soak
@pytest.mark.parametrize(
    "model", ["smollm2", "demo-omni", "demo-image", "demo-qwen3-tts", "demo-cosyvoice3"]
)
def test_verify_full(capsys, model):
    assert_passes(capsys, "--model", model)


def test_verify_fails_naming_the_first_difference(capsys, monkeypatch, tiny_llama_f64):
    """Async scheduling broken on purpose: request r0's third token comes out changed in
    the async and speculative runs only. Verify must exit 1 and name r0, stage llm,
    token position 2."""
    original = AsyncScheduler.update_from_output

    def corrupting(self, scheduler_output, runner_output):
        request, row = self.requests.get("r0"), runner_output.req_id_to_index.get("r0")
        if request is not None and row is not None and len(request.output_token_ids) == 2:
            sampled = list(runner_output.sampled_token_ids[row])
            if sampled:
                sampled[0] ^= 1
                runner_output.sampled_token_ids[row] = sampled
        return original(self, scheduler_output, runner_output)

    monkeypatch.setattr(AsyncScheduler, "update_from_output", corrupting)
    model = str(tiny_llama_f64)
    code, text, result = verify(capsys, "--model", model, "--short", "--dtype", "float64", "--json")
    assert code == 1, text
    assert result is not None and not result["ok"]
    first = result["first_mismatch"]
    assert first["check"] == "sync = async"
    assert (first["request"], first["stage"], first["position"]) == ("r0", "llm", 2), first
    assert "first at request r0, stage llm, token position 2" in text
    rows = {c["name"]: c["result"] for c in result["checks"]}
    assert rows["sync = async"] == "FAIL" and rows["batched = alone"] == "pass"


def test_verify_names_the_stage_of_a_pipeline_that_differs(capsys, monkeypatch):
    """demo-omni's talker broken on purpose under async scheduling (its third code of r0
    changed), its thinker intact: verify names r0, stage talker, position 2."""
    original = AsyncScheduler.update_from_output

    def corrupting(self, scheduler_output, runner_output):
        request, row = self.requests.get("r0"), runner_output.req_id_to_index.get("r0")
        talker = self.config.model_part == "talker"
        if talker and request is not None and row is not None:
            sampled = list(runner_output.sampled_token_ids[row])
            if sampled and len(request.output_token_ids) == 2:
                sampled[0] ^= 1
                runner_output.sampled_token_ids[row] = sampled
        return original(self, scheduler_output, runner_output)

    monkeypatch.setattr(AsyncScheduler, "update_from_output", corrupting)
    code, text, result = verify(capsys, "--model", "demo-omni", "--short", "--json")
    assert code == 1, text
    first = result["first_mismatch"]
    assert first["check"] == "sync = async"
    assert (first["request"], first["stage"], first["position"]) == ("r0", "talker", 2), first


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--requests", "0"], "--requests"),
        (["--dtype", "float7"], "dtype"),
        (["--model", "/no/such/model"], "--model"),
        (["--model", "no-such-model"], "no-such-model"),
        (["--deploy", "/no/such/deploy.yaml"], "deploy file not found"),
    ],
)
def test_bad_arguments_exit_2_naming_the_field(capsys, argv, field):
    code, text, _ = verify(capsys, *argv)
    assert code == 2, text
    assert field in text and "Traceback" not in text
