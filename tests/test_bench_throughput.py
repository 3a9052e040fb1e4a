"""`omnistage bench throughput`: its workloads, and the vLLM peer's wiring (a fake stands in
for vLLM's Python, which is never our dependency)."""

from __future__ import annotations

import json
import os
import random
import stat

import pytest

from omnistage.benchmarks.throughput_workloads import make_workload, parse_input_len


def test_input_len_is_a_length_or_a_range_and_bad_ones_are_named():
    assert parse_input_len("128") == (128, 128)
    assert parse_input_len("16-300") == (16, 300)
    for bad in ("0", "300-16", "a", "1-2-3", ""):
        with pytest.raises(ValueError, match="--input-len"):
            parse_input_len(bad)


def test_prompts_of_a_range_have_lengths_in_it_and_fixed_ones_are_unchanged():
    ranged = make_workload(48, (16, 300), 1000, seed=0)
    assert all(16 <= len(p) <= 300 for p in ranged) and len({len(p) for p in ranged}) > 10
    assert ranged == make_workload(48, (16, 300), 1000, seed=0)
    fixed = make_workload(3, (5, 5), 1000, seed=1)
    # the fixed-length workload draws no lengths: the same token stream as before ranges
    rng = random.Random(1)
    assert fixed == [[rng.randrange(100, 999) for _ in range(5)] for _ in range(3)]


def test_vllm_peer_gets_the_same_prompts_and_is_compared(tmp_path, capsys):
    from omnistage.entrypoints.cli import main

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 777}))
    seen = tmp_path / "spec.json"
    fake = tmp_path / "python"
    result = {"elapsed_s": 2.0, "output_tokens": 24, "startup_to_first_token_s": 1.0}
    fake.write_text(f"#!/bin/sh\ncat > {seen}\necho '{json.dumps(result)}'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    argv = ["bench", "throughput", "--model", "tiny-random", "--peers", "omnistage,vllm"]
    argv += ["--num-prompts", "3", "--input-len", "4-9", "--output-len", "8"]
    argv += ["--vllm-python", str(fake), "--vllm-model", str(model)]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["vllm_output_tok_s"] == 12.0 and summary["ratio_vs_vllm"] > 0
    spec = json.loads(seen.read_text())
    assert spec["prompts"] == make_workload(3, (4, 9), 777, 0) and spec["output_len"] == 8
    assert "4-9" in summary["workload"]


def test_vllm_peer_flags_are_named(capsys):
    from omnistage.entrypoints.cli import main

    assert main(["bench", "throughput", "--peers", "vllm"]) == 2
    assert "--vllm-python" in capsys.readouterr().err
    argv = ["bench", "throughput", "--peers", "vllm", "--vllm-python", os.__file__]
    assert main(argv) == 2
    assert "--vllm-model" in capsys.readouterr().err
