"""`omnistage bench tts --model demo-cosyvoice3`'s reference side, without the reference:
the peer's texts are our c=1 texts, its JSON line is parsed and summarized as ours are
(median TTFA and RTF, all audio over all wall time), its audio must be 25 speech tokens a
second (how our tokens are counted), the ratio is its RTF over ours and the token
counts are compared; a failing peer raises with its stderr; `--peer-python` picks the
peer's Python, and the peer is skipped without its venv; the qwen-tts comparison, split
out of `tts.main` beside it, still computes its ratios."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from omnistage.benchmarks import tts, tts_cosyvoice3


def _peer(mode: str = "stream", tokens: tuple[int, ...] = (700, 700, 700)) -> dict:
    walls = (14.0, 17.5, 21.0)
    requests = [
        {
            "text_tokens": 35,
            "budget": 700,
            "tokens": t,
            "spoken_tokens": t,
            "first_audio_s": 0.1 * (i + 1),
            "wall_s": walls[i],
            "audio_samples": t * 960,
            "audio_s": t / 25,
        }
        for i, t in enumerate(tokens)
    ]
    return {"voice": "bright", "mode": mode, "seed": 0, "requests": requests}


def test_peer_texts_are_our_c1_texts_per_mode_and_run():
    assert tts_cosyvoice3.peer_texts(["a b c d"], 2) == [
        "str0 a b c d",
        "pay0 a b c d",
        "str1 a b c d",
        "pay1 a b c d",
    ]


def test_summarize_reports_medians_and_the_whole_run():
    s = tts_cosyvoice3.summarize(_peer())
    assert s["requests"] == 3 and s["voice"] == "bright" and s["mode"] == "stream"
    assert s["ttfa_median_s"] == pytest.approx(0.2)
    assert s["rtf_median"] == pytest.approx(17.5 / 28)
    assert s["audio_s_per_s"] == pytest.approx(84 / 52.5)
    assert s["tokens"] == s["spoken_tokens"] == [700, 700, 700]
    assert s["budgets"] == [700, 700, 700]


def test_summarize_refuses_audio_that_is_not_25_tokens_a_second():
    peer = _peer()
    peer["requests"][1]["audio_s"] = 27.5
    with pytest.raises(ValueError, match="not 25.0 tokens a second"):
        tts_cosyvoice3.summarize(peer)
    with pytest.raises(ValueError, match="no requests"):
        tts_cosyvoice3.summarize({**_peer(), "requests": []})


def test_compare_gives_the_ratio_and_whether_the_tokens_agree():
    ours = {
        "stream": {"rtf_median": 0.25, "audio_s_per_request": 28.0},
        "payload": {"rtf_median": 0.5, "audio_s_per_request": 27.96},
    }
    peers = {
        "stream": tts_cosyvoice3.summarize(_peer()),
        "payload": tts_cosyvoice3.summarize(_peer("whole")),
    }
    fields = tts_cosyvoice3.compare(ours, peers)
    assert fields["ratio_rtf_vs_reference_stream_c1"] == pytest.approx(2.5, abs=1e-3)
    assert fields["ratio_rtf_vs_reference_payload_c1"] == pytest.approx(1.25, abs=1e-3)
    assert fields["reference_stream_c1_rtf"] == pytest.approx(0.625)
    assert fields["stream_c1_tokens_per_request"] == 700
    assert fields["payload_c1_tokens_per_request"] == 699
    assert fields["same_tokens_stream"] is True
    assert fields["same_tokens_payload"] is False
    json.dumps(fields)  # it goes into the final JSON line


def test_run_peer_reads_the_last_line_and_raises_with_stderr():
    line = json.dumps(_peer())
    out = tts_cosyvoice3.run_peer([sys.executable, "-c", f"print('log'); print({line!r})"])
    assert out == _peer()
    fail = [sys.executable, "-c", "import sys; sys.stderr.write('no cosyvoice'); sys.exit(3)"]
    with pytest.raises(RuntimeError, match="no cosyvoice"):
        tts_cosyvoice3.run_peer(fail)


def test_command_runs_the_peer_script_with_the_texts():
    cmd = tts_cosyvoice3.command(tts_cosyvoice3.DEFAULT_PYTHON, Path("ckpt"), ["x y"], 7, "whole")
    assert cmd[1].endswith("omnistage/benchmarks/cosyvoice3_peer.py")
    assert cmd[2:] == ["ckpt", '["x y"]', "7", "whole"]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    tts.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_peer_python_defaults_per_model_and_is_skipped_without_its_venv(tmp_path):
    assert tts.peer_python(_args()) == tts.DEFAULT_REFERENCE
    cosy = _args("--model", "demo-cosyvoice3")
    assert tts.peer_python(cosy) == tts_cosyvoice3.DEFAULT_PYTHON
    missing = str(tmp_path / "python")
    for flag in ("--peer-python", "--reference-python"):
        args = _args("--model", "demo-cosyvoice3", flag, missing)
        assert str(tts.peer_python(args)) == missing
        assert tts.run_cosyvoice3_peer(args, [1]) is None


def test_the_peer_rows_line_up_with_ours(capsys):
    tts_cosyvoice3.print_rows({"stream": tts_cosyvoice3.summarize(_peer())})
    row = capsys.readouterr().out.splitlines()[0]
    assert row.split() == ["ref-stream", "1", "0.200", "0.625", "1.60"]
    header = f"{'mode':<11}{'conc':>5}"  # tts.main's: the level ends where "conc" does
    assert row[: len(header)].endswith(" 1") and header.endswith("conc")


def test_the_bench_reports_the_ratio_and_tokens_per_mode(capsys):
    best = {
        "stream": {1: {"rtf_median": 1.25, "audio_s_per_request": 28.0}},
        "payload": {1: {"rtf_median": 0.25, "audio_s_per_request": 28.0}},
    }
    peers = {"stream": _peer(), "payload": _peer("whole")}
    fields = tts._cosyvoice3_peer_fields(
        best, {m: tts_cosyvoice3.summarize(p) for m, p in peers.items()}
    )
    assert fields["ratio_rtf_vs_reference_stream_c1"] == 0.5
    assert fields["ratio_rtf_vs_reference_payload_c1"] == 2.5
    assert fields["reference_voice"] == "bright"
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("reference stream: RTF 0.625; its RTF / ours at c=1 0.50")
    assert out[1].startswith("reference whole: RTF 0.625; its RTF / ours at c=1 2.50")
    assert "ours 700, reference [700, 700, 700] written" in out[1]


def test_the_qwen_tts_comparison_is_unchanged_by_the_split(capsys):
    best = {"stream": {1: {"rtf_median": 2.0}, 16: {"audio_s_per_s": 12.0}}}
    alone, batched = {"rtf": 8.0}, {"audio_s_per_s": 1.5}
    fields = tts._qwen_peer_fields(best, [1, 16], alone, batched)
    assert fields["ratio_rtf_vs_reference_c1"] == 4.0
    assert fields["ratio_aggregate_vs_reference_c16"] == 8.0
    assert fields["target_rtf_met"] is True and fields["target_aggregate_met"] is False
    assert "RTF 4.00x better at c=1" in capsys.readouterr().out
