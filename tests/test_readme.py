"""The README's examples, run exactly as written.

Each example is the fenced block right after an HTML comment
`<!-- readme-test: NAME -->` in README.md:

- `python-example`: written to `first.py` and run as a plain script, `python first.py`,
  in a fresh process (no `if __name__ == "__main__":` guard in it);
- `serve-command`: the `omnistage serve ...` command line, started as a process;
- `serve-client`: the `openai` client script, run against that server.

Plus a cheap check that README.md stays a quickstart (at most 150 lines, opening with
`make run` / `make test`) and that every relative link in it and in docs/ resolves.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.process_helpers import free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 150

_MARKER = re.compile(r"<!--\s*readme-test:\s*([\w-]+)\s*-->")
_FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)\s*$")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def readme_blocks(text: str) -> dict[str, tuple[str, str]]:
    """`{marker name: (fence language, code)}` for each `<!-- readme-test: NAME -->`
    followed (after blank lines only) by a fenced code block."""
    lines = text.splitlines()
    blocks: dict[str, tuple[str, str]] = {}
    i = 0
    while i < len(lines):
        marker = _MARKER.fullmatch(lines[i].strip())
        i += 1
        if marker is None:
            continue
        name = marker.group(1)
        while i < len(lines) and not lines[i].strip():
            i += 1
        fence = _FENCE.match(lines[i]) if i < len(lines) else None
        if fence is None:
            raise AssertionError(f"README: marker {name!r} is not followed by a code fence")
        ticks, language = fence.groups()
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != ticks:
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"README: the code block after {name!r} is never closed")
        if name in blocks:
            raise AssertionError(f"README: marker {name!r} appears twice")
        blocks[name] = (language, "\n".join(body) + "\n")
        i += 1
    return blocks


def _block(name: str, language: str) -> str:
    blocks = readme_blocks(README.read_text())
    assert name in blocks, f"README.md has no `<!-- readme-test: {name} -->` block"
    found, code = blocks[name]
    assert found == language, f"README block {name!r} is ```{found}, expected ```{language}"
    return code


def _env() -> dict[str, str]:
    """The environment of a user who ran `make setup`: offline, nothing else set. The
    repository root goes first on PYTHONPATH so the package next to this README runs."""
    env = os.environ | {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMNISTAGE_API_KEY": "",  # the README's server takes no key
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _generated_words(stdout: str, code: str) -> set[str]:
    """Words printed that the script itself does not contain: the model's text (a script
    that printed only its own prompts, or nothing, has none)."""
    return set(re.findall(r"\w+", stdout)) - set(re.findall(r"\w+", code))


def _omnistage_command() -> list[str]:
    """How to run `omnistage`: the console script of this interpreter's environment, or,
    where there is none, the CLI module under this interpreter."""
    script = Path(sys.executable).parent / "omnistage"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "omnistage.entrypoints.cli"]


def _run_python(script: Path, code: str, timeout: float) -> tuple[subprocess.CompletedProcess, str]:
    """`code` written to `script` and run as `python script` in its folder; the result and a
    report of its exit code and output for failed assertions."""
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, script.name],
        cwd=script.parent,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    report = f"exit code {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc, report


@pytest.mark.slow
def test_python_example_runs_as_a_plain_script(tmp_path):
    code = _block("python-example", "python")
    assert "__main__" not in code, "the README example must be a plain script"
    proc, report = _run_python(tmp_path / "first.py", code, timeout=180)
    assert proc.returncode == 0, report
    assert proc.stdout.strip(), report
    assert _generated_words(proc.stdout, code), report
    assert "Traceback" not in proc.stderr, report


def _wait_for_health(url: str, server: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if server.poll() is not None:
            pytest.fail(f"the server exited ({server.returncode}):\n{log.read_text()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no 200 from {url}/health within {timeout} s:\n{log.read_text()}")
        time.sleep(0.5)


def _stop(server: subprocess.Popen) -> None:
    """SIGINT (as Ctrl-C), then SIGKILL if it does not exit; then wait until nothing of
    its process group (the server and every process it started) is left."""
    if server.poll() is None:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)
    deadline = time.monotonic() + 15
    while True:
        try:
            os.killpg(server.pid, 0)  # the group the server led (start_new_session)
        except ProcessLookupError:
            return
        if time.monotonic() > deadline:
            os.killpg(server.pid, signal.SIGKILL)
            pytest.fail("processes the server started were still running 15 s after it exited")
        time.sleep(0.2)


@pytest.mark.slow
def test_server_example_answers_the_client_example(tmp_path):
    command = shlex.split(_block("serve-command", "bash"), comments=True)
    assert command[:2] == ["omnistage", "serve"], command
    client = _block("serve-client", "python")

    # The README serves on port 8000; another server may hold it on this machine, so the
    # test puts a free port in both the server's `--port` and the client's base_url.
    port = free_port()
    assert "--port" in command, "the README's serve command should name its --port"
    readme_port = command[command.index("--port") + 1]
    command[command.index("--port") + 1] = str(port)
    readme_url = f"http://127.0.0.1:{readme_port}/v1"
    assert client.count(readme_url) == 1, f"the client should use {readme_url}"
    client = client.replace(readme_url, f"http://127.0.0.1:{port}/v1")

    log = tmp_path / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            _omnistage_command() + command[1:],
            cwd=tmp_path,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: see _stop
        )
    try:
        _wait_for_health(f"http://127.0.0.1:{port}", server, log, timeout=120)
        proc, report = _run_python(tmp_path / "client.py", client, timeout=120)
        assert proc.returncode == 0, report + f"\nserver log:\n{log.read_text()}"
        assert proc.stdout.strip(), report
    finally:
        _stop(server)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _prose(path: Path) -> str:
    """A markdown file without its code blocks and code spans."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+)$", text, flags=re.M)}


def test_readme_is_a_quickstart_and_its_links_resolve():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"
    opening = [line.split()[:2] for line in lines[1:] if line.strip()][:4]
    assert lines[0].startswith("# ") and opening == [
        ["```bash"],
        ["make", "run"],
        ["make", "test"],
        ["```"],
    ], "README.md should open, after its title, with `make run` and `make test`"

    documents = [README, *sorted((ROOT / "docs").glob("*.md"))]
    linked_docs = set()
    for document in documents:
        for target in _LINK.findall(_prose(document)):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            path = (document.parent / file).resolve() if file else document
            where = f"{document.relative_to(ROOT)}: link {target!r}"
            assert path.is_file(), f"{where} points to no file"
            if anchor and path.suffix == ".md":
                assert anchor in _anchors(path), f"{where}: no such heading"
            if document == README:
                linked_docs.add(path)
    unlinked = [p.name for p in documents[1:] if p not in linked_docs]
    assert not unlinked, f"docs not linked from README.md: {unlinked}"
