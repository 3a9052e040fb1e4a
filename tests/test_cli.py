"""The `omnistage` command line on a tiny checkpoint and the built-in listing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from omnistage.entrypoints.cli import main


def test_generate_prints_the_text(tiny_llama, capsys):
    assert (
        main(["generate", "hello", "--model", str(tiny_llama), "--max-tokens", "8", "--seed", "1"])
        == 0
    )
    out = capsys.readouterr().out
    assert out.strip() != ""


def test_generate_chat_and_sampling_flags(tiny_llama, capsys):
    args = [
        "generate",
        "hi",
        "--model",
        str(tiny_llama),
        "--chat",
        "--max-tokens",
        "6",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--seed",
        "3",
    ]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first  # seeded: reproducible


def test_bad_input_is_a_clear_error_not_a_traceback(tiny_llama, capsys):
    assert main(["generate", "hi", "--model", str(tiny_llama), "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err
    assert main(["generate", "hi", "--model", "no-such-model"]) == 2


def test_models_lists_the_builtin(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "smollm2" in out and "LlamaForCausalLM" in out


def test_console_script_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "omnistage.entrypoints.cli", "models"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "smollm2" in proc.stdout


@pytest.mark.slow  # three process-per-stage pipelines start (~10 s each on 2 cores)
def test_bench_pipeline_ends_with_a_json_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path))  # the tiny checkpoint, made here
    args = ["bench", "pipeline", "--concurrency", "2", "--thinker-tokens", "4"]
    assert main([*args, "--talker-tokens", "6", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["benchmark"] == "pipeline" and "2 concurrent requests" in summary["workload"]
    for key in (
        "overlapped_req_s",
        "sequential_req_s",
        "in_process_req_s",
        "ratio_overlapped_vs_sequential",
        "ratio_overlapped_vs_in_process",
        "ttfo_stream_median_s",
        "ttfo_payload_median_s",
        "ratio_ttfo_stream_vs_payload",
    ):
        assert summary[key] > 0, key
    assert "overlapped / sequential" in out and "stream / payload" in out


def test_generate_with_a_deploy_file_writes_text_and_a_wav(tmp_path, capsys):
    import wave

    import yaml

    from omnistage.testing.tiny_pipeline import make_tiny_omni, tiny_pipeline_deploy

    model = make_tiny_omni(tmp_path / "tiny-omni")
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(yaml.safe_dump(tiny_pipeline_deploy(model, talker_tokens=10)))
    out_dir = tmp_path / "out"
    argv = ["generate", "hello", "--deploy", str(deploy), "--in-process", "--out", str(out_dir)]
    assert main([*argv, "--max-tokens", "5"]) == 0
    printed = capsys.readouterr()
    text = (out_dir / "text.txt").read_text()
    assert printed.out == text + "\n"
    assert "audio.wav" in printed.err
    with wave.open(str(out_dir / "audio.wav")) as wav:
        assert wav.getframerate() == 16000 and wav.getsampwidth() == 2
        assert wav.getnframes() == 10 * 8  # 10 codes x 8 samples each
    assert main([*argv, "--modalities", "image"]) == 2
    assert "modalities: 'image' cannot be produced" in capsys.readouterr().err


def test_generate_with_speculative_config_prints_the_same_text(tiny_llama, capsys):
    args = ["generate", "hello", "--model", str(tiny_llama), "--max-tokens", "12", "--seed", "1"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    spec = json.dumps(
        {"method": "draft_model", "model": str(tiny_llama), "num_speculative_tokens": 3}
    )
    assert main([*args, "--speculative-config", spec, "--no-async-scheduling"]) == 0
    assert capsys.readouterr().out == plain
    assert main([*args, "--speculative-config", '{"method": "ngram"}']) == 2
    assert "num_speculative_tokens" in capsys.readouterr().err
