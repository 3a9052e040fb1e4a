"""The engine never re-imports the user's program: every way of running Python works.

Each form runs as a real subprocess, with async scheduling (the default: the runner
lives in a worker process) and, for `Omni`, a process per stage. All forms run at
once (each is mostly waiting on imports) and must print the model's answer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

GENERATE = """\
from omnistage import LLM, SamplingParams

llm = LLM(model="smollm2")
outputs = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=4))
print("ANSWER:", outputs[0].outputs[0].text)
"""

GUARDED = f"""\
def main():
{textwrap.indent(GENERATE, "    ")}

if __name__ == "__main__":
    main()
"""

TWO_ENGINES = """\
from omnistage import LLM, SamplingParams

for _ in range(2):
    llm = LLM(model="smollm2", max_model_len=256)
    outputs = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=4))
    print("ANSWER:", outputs[0].outputs[0].text)
    del llm
"""

OMNI = """\
from omnistage.pipeline.omni import Omni

omni = Omni(model="demo-omni")
(out,) = omni.generate([{"messages": [{"role": "user", "content": "Hi"}]}])
print("ANSWER:", out.text is not None, out.audio.shape, out.sample_rate)
"""


def _forms(tmp: Path) -> dict[str, tuple[list[str], str | None]]:
    """name -> (command, standard input)."""
    (tmp / "plain.py").write_text(GENERATE)
    (tmp / "guarded.py").write_text(GUARDED)
    (tmp / "two_engines.py").write_text(TWO_ENGINES)
    (tmp / "omni_script.py").write_text(OMNI)
    pkg = tmp / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(GENERATE)
    py = sys.executable
    return {
        "script without a guard": ([py, "plain.py"], None),
        "script with a guard": ([py, "guarded.py"], None),
        "python -c": ([py, "-c", GENERATE], None),
        "code piped to python -": ([py, "-"], GENERATE),
        "python -m package.module": ([py, "-m", "userpkg.mod"], None),
        "two LLMs one after the other": ([py, "two_engines.py"], None),
        "Omni(demo-omni) at top level": ([py, "omni_script.py"], None),
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("user-programs")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    running = {
        name: (
            subprocess.Popen(
                command,
                cwd=tmp,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
            stdin,
        )
        for name, (command, stdin) in _forms(tmp).items()
    }
    done = {}
    for name, (proc, stdin) in running.items():
        try:
            out, err = proc.communicate(stdin, timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


@pytest.mark.parametrize(
    "form",
    [
        "script without a guard",
        "script with a guard",
        "python -c",
        "code piped to python -",
        "python -m package.module",
        "two LLMs one after the other",
        "Omni(demo-omni) at top level",
    ],
)
def test_every_form_of_user_program_prints_the_answer(results, form):
    result = results[form]
    report = f"{form}: exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, report
    answers = [line for line in result.stdout.splitlines() if line.startswith("ANSWER:")]
    expected = 2 if form.startswith("two") else 1
    assert len(answers) == expected, report
    if form.startswith("Omni"):
        assert answers[0].startswith("ANSWER: True (") and answers[0].endswith(" 24000"), report
    else:
        assert all(a.split(":", 1)[1].strip() for a in answers), report
        assert len(set(answers)) == 1, report  # greedy: the same answer every way
    assert "bootstrapping phase" not in result.stderr, report
