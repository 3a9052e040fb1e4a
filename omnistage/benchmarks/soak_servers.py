"""`omnistage bench soak`'s servers: the `omnistage serve` command of each (kind, mode).

Kinds and their models (random weights made locally once; nothing is downloaded):

- `text`: a tiny random llama (2 layers, byte tokenizer) served in float64, or
  `--text-model` (e.g. smollm2, in its own dtype);
- `omni`: demo-omni (thinker -> talker -> code2wav), every stage in float64;
- `image`: demo-image (thinker -> draw), every stage in float64.

Modes: `sync` (`async_scheduling` off on every autoregressive stage), `async` (on), and
`spec`: async with n-gram speculation (`SPECULATIVE`) on every autoregressive stage
that takes drafts — all but demo-omni's talker (`NO_DRAFTS`: it samples extra codes per
token, which a verify pass cannot check), which runs async without them; demo-omni's
thinker speculates while it sends its hidden states downstream. A pipeline's modes are
written as a deploy file (the packaged one with those engine args), whose edges use an shm connector named for this run, so its
segments can be counted apart from any other pipeline's (`soak_probe`).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from pathlib import Path
from typing import Any

from omnistage.benchmarks.serve import SERVE_COMMAND

MODES = ("sync", "async", "spec")
SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
DEMOS = {"omni": "demo-omni", "image": "demo-image"}
NO_DRAFTS = {"talker"}
"""Stages that take no `speculative_config` (demo-omni's talker samples extra codes per
token): async without drafts in the `spec` mode."""
TEXT_MODEL_NAME = "soak-text"
TINY_TEXT = "tiny-llama-v1"


@dataclasses.dataclass(frozen=True)
class ServerPlan:
    """How to start one (kind, mode) server."""

    kind: str
    mode: str
    command: list[str]
    """`omnistage serve ...` without --host / --port."""
    model_name: str
    """What requests give as `model`."""
    shm_connector: str | None
    """The pipeline's shm connector (None: a text model, no connector)."""


def tiny_text_model() -> Path:
    """The soak's tiny random llama (made on first use, in the omnistage cache)."""
    from omnistage.cache import build_into_place, cache_root

    final = cache_root() / "soak" / TINY_TEXT
    if not (final / "config.json").is_file():

        def build(tmp: Path) -> None:
            from omnistage.models.tiny_checkpoints import make_checkpoint

            make_checkpoint(tmp, seed=0)

        build_into_place(final, build, lambda p: (p / "config.json").is_file())
    return final


def text_plan(mode: str, text_model: str | None) -> ServerPlan:
    model = text_model or str(tiny_text_model())
    cmd = [*SERVE_COMMAND, "--model", model, "--served-model-name", TEXT_MODEL_NAME]
    cmd += ["--dtype", "float64"] if text_model is None else []
    cmd += ["--seed", "0", "--async-scheduling" if mode != "sync" else "--no-async-scheduling"]
    if mode == "spec":
        cmd += ["--speculative-config", json.dumps(SPECULATIVE)]
    return ServerPlan("text", mode, cmd, TEXT_MODEL_NAME, None)


def pipeline_deploy_dict(kind: str, mode: str, connector: str) -> dict[str, Any]:
    """The packaged deploy of the kind's demo with the mode's engine args, float64, and
    every shm edge on `connector`."""
    import yaml

    from omnistage.models.builtin import demo_model_path
    from omnistage.pipeline.deploy import packaged_deploy_path

    demo = DEMOS[kind]
    deploy = yaml.safe_load(packaged_deploy_path(demo).read_text(encoding="utf-8"))
    model = str(demo_model_path(demo))
    for stage in deploy["stages"]:
        stage["model"] = model
        engine_args = stage.setdefault("engine_args", {})
        engine_args["dtype"] = "float64"
        if stage["kind"] == "ar":
            engine_args["async_scheduling"] = mode != "sync"
            if mode == "spec" and stage["name"] not in NO_DRAFTS:
                engine_args["speculative_config"] = dict(SPECULATIVE)
    deploy["connectors"] = {**(deploy.get("connectors") or {}), connector: {"kind": "shm"}}
    for edge in deploy["edges"]:
        if edge.get("connector") == "shm":
            edge["connector"] = connector
    return deploy


def pipeline_plan(kind: str, mode: str, workdir: Path, in_process: bool) -> ServerPlan:
    import yaml

    connector = f"soak{secrets.token_hex(4)}"
    path = workdir / f"{kind}-{mode}.yaml"
    path.write_text(yaml.safe_dump(pipeline_deploy_dict(kind, mode, connector)), encoding="utf-8")
    cmd = [*SERVE_COMMAND, "--deploy", str(path), "--served-model-name", DEMOS[kind], "--seed", "0"]
    cmd += ["--in-process"] if in_process else []
    return ServerPlan(kind, mode, cmd, DEMOS[kind], connector)


def plan(
    kind: str, mode: str, workdir: Path, text_model: str | None, in_process: bool
) -> ServerPlan:
    if kind == "text":
        return text_plan(mode, text_model)
    return pipeline_plan(kind, mode, workdir, in_process)
