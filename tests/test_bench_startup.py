"""`omnistage bench startup` runs fresh processes and ends with one JSON line (no timing
is asserted: speed is measured by the benchmark, not by tests)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_startup_reports_the_script_and_its_phases(tiny_llama):
    command = [sys.executable, "-m", "omnistage.entrypoints.cli", "bench", "startup"]
    args = ["--runs", "1", "--peers", "script,transformers", "--model", str(tiny_llama)]
    proc = subprocess.run(command + args, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["bench"] == "startup" and summary["runs"] == 1
    assert summary["script_s"] > 0 and summary["transformers_s"] > 0
    assert summary["transformers_over_script"] > 0
    phases = summary["script_phases_s"]
    assert list(phases) == ["interpreter start", "import omnistage", "LLM(...)", "first step"]
    worker = summary["worker_phases_s"]
    for phase in ("worker process start and imports", "config", "weights"):
        assert worker[phase] > 0
