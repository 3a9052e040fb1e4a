"""`omnistage verify --model M [--deploy D]`: the arguments, the runs of each
configuration, the checks, the table and the exit status.

    omnistage verify --model smollm2|demo-omni|demo-image|PATH [--deploy FILE|NAME]
                     [--short] [--requests N] [--seed S] [--dtype D] [--json]

A model with one stage runs on the LLM engine (`text_runs`), a pipeline (a demo, an
omni checkpoint, a deploy) on the orchestrator (`pipeline_runs`), both in this
process. Exit status: 0 when every check passes, 1 on any mismatch, failed request or
leak, 2 on bad arguments (the CLI prints the `ValueError`, which names the field).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from omnistage.entrypoints.verify.checks import (
    SKIPPED,
    Check,
    compare_runs,
    ended_check,
    leak_check,
)
from omnistage.entrypoints.verify.report import print_table, result_json
from omnistage.entrypoints.verify.results import RunResult
from omnistage.entrypoints.verify.workload import SIZES, VerifyRequest, make_workload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default=None, help="built-in name (smollm2, demo-omni, ...) or a path"
    )
    parser.add_argument("--deploy", default=None, help="a pipeline's deploy file or packaged name")
    parser.add_argument(
        "--short", action="store_true", help=f"{SIZES['short'][0]} short requests (default: full)"
    )
    parser.add_argument("--requests", type=int, default=None, help="how many requests")
    parser.add_argument("--seed", type=int, default=0, help="the workload's seed")
    parser.add_argument("--dtype", default=None, help="every stage's dtype (default: its own)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")


def check_args(args: argparse.Namespace) -> tuple[Any, list[VerifyRequest]]:
    """The pipeline's deploy (None: a text model) and the workload; ValueError naming
    the bad field."""
    from omnistage.config import DEFAULT_MODEL, dtype_name

    if args.model is None and args.deploy is None:
        args.model = DEFAULT_MODEL
    if args.dtype is not None:
        dtype_name(args.dtype)
    size = "short" if args.short else "full"
    count = SIZES[size][0] if args.requests is None else args.requests
    if count < 1:
        raise ValueError(f"--requests: must be at least 1, got {count}")
    workload = make_workload(count, args.seed, size)
    return deploy_of(args), workload


def deploy_of(args: argparse.Namespace) -> Any:
    """The deploy of a pipeline, or None for a model served as one text stage."""
    from omnistage.pipeline.deploy import check_stage_models, deploy_for_model, load_deploy

    if args.deploy is not None:
        spec = load_deploy(_deploy_path(args.deploy))
        spec = spec.with_model(args.model) if args.model is not None else spec
    else:
        if "/" in args.model and not Path(args.model).expanduser().exists():
            raise ValueError(f"--model: {args.model} does not exist")
        spec = deploy_for_model(args.model)
        if not spec.is_pipeline and spec.stages[0].kind == "ar":
            from omnistage.models.loader import resolve_model

            resolve_model(args.model)  # an unknown name fails here, naming it
            return None
    check_stage_models(spec)
    return spec


def _deploy_path(deploy: str) -> Path:
    """A deploy file, or the name of one shipped with the package."""
    from omnistage.pipeline.deploy import packaged_deploy_path

    path = Path(deploy).expanduser()
    if path.exists() or "/" in deploy or deploy.endswith((".yaml", ".yml")):
        return path
    return packaged_deploy_path(deploy)


def verify_text(model: str, workload: list[VerifyRequest], dtype: str | None) -> list[Check]:
    from omnistage.entrypoints.verify import text_runs

    dtype = dtype or "auto"
    runs: dict[str, RunResult] = {}
    with text_runs.text_engine(model, "sync", workload, dtype) as engine:
        runs["sync"] = text_runs.run_batched(engine, "sync", workload)
        runs["alone"] = text_runs.run_alone(engine, workload)
        drafts = text_runs.takes_drafts(engine)
    with text_runs.text_engine(model, "async", workload, dtype) as engine:
        runs["async"] = text_runs.run_batched(engine, "async", workload)
    note = "the model takes no drafts" if not drafts else "n-gram drafts"
    if drafts:
        with text_runs.text_engine(model, "spec", workload, dtype) as engine:
            runs["spec"] = text_runs.run_batched(engine, "spec", workload)
    return build_checks(runs, workload, note)


def verify_pipeline(spec: Any, workload: list[VerifyRequest], dtype: str | None) -> list[Check]:
    from omnistage.entrypoints.verify import pipeline_runs as pr

    runs: dict[str, RunResult] = {}
    with pr.pipeline(spec, "sync", set(), dtype) as (omni, recorder):
        runs["sync"] = pr.run_batched(omni, recorder, "sync", workload)
        runs["alone"] = pr.run_alone(omni, recorder, workload)
        drafts, no_drafts = pr.draft_stages(omni)
    with pr.pipeline(spec, "async", set(), dtype) as (omni, recorder):
        runs["async"] = pr.run_batched(omni, recorder, "async", workload)
    if drafts:
        with pr.pipeline(spec, "spec", drafts, dtype) as (omni, recorder):
            runs["spec"] = pr.run_batched(omni, recorder, "spec", workload)
    note = f"n-gram drafts on {', '.join(sorted(drafts))}" if drafts else "no stage takes drafts"
    if drafts and no_drafts:
        note += f"; {', '.join(sorted(no_drafts))} takes no drafts (async without)"
    return build_checks(runs, workload, note)


def build_checks(
    runs: dict[str, RunResult], workload: list[VerifyRequest], spec_note: str
) -> list[Check]:
    """The table's rows: the three equivalences, then the failure and leak checks."""
    keys = [r.key for r in workload if r.abort_after is None]
    checks = [compare_runs("sync = async", runs["sync"], runs["async"], keys)]
    if "spec" in runs:
        check = compare_runs("sync = speculative", runs["sync"], runs["spec"], keys, joined=True)
        check.note = spec_note + " (payloads joined per edge: a step may hand on several rows)"
    else:
        check = Check("sync = speculative", "sync vs spec", 0, SKIPPED, spec_note)
    checks.append(check)
    checks.append(compare_runs("batched = alone", runs["sync"], runs["alone"], keys))
    checks.append(ended_check(runs, keys))
    checks.append(leak_check(runs))
    return checks


def main(args: argparse.Namespace) -> int:
    spec, workload = check_args(args)
    started = time.perf_counter()
    if spec is None:
        name = args.model
        checks = verify_text(args.model, workload, args.dtype)
    else:
        name = args.model or args.deploy
        checks = verify_pipeline(spec, workload, args.dtype)
    print_table(name, checks)
    extra = {
        "requests": len(workload),
        "aborted": sum(r.abort_after is not None for r in workload),
        "seed": args.seed,
        "size": "short" if args.short else "full",
        "wall_s": round(time.perf_counter() - started, 1),
    }
    result = result_json(name, checks, extra)
    if args.json:
        print(json.dumps(result))
    return 0 if result["ok"] else 1
