"""`omnistage verify` on a text model: the LLM engine built in-process, once per
configuration, and driven step by step through the workload.

Configurations (`CONFIGS`): `sync` (synchronous scheduling, the runner inline),
`async` (asynchronous scheduling, one batch always in flight: the runner on a worker
thread, so no second copy of the weights is loaded), `spec` (async with n-gram
speculation, `SPECULATIVE`), and `alone` (the sync engine again, each request run by
itself). A batched run adds every request at once and aborts the workload's aborted
requests once they have `abort_after` tokens; the leak check then reads the engine's
own counters (`engine_leaks`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from omnistage.entrypoints.verify.results import RunResult, StageTrace
from omnistage.entrypoints.verify.workload import VerifyRequest

SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
STAGE = "llm"
"""The one stage of a text model, as the table names it."""
MAX_STEPS = 100_000


def engine_config(model: str, config: str, requests: list[VerifyRequest], dtype: str) -> Any:
    """The `EngineConfig` of one configuration; its KV cache sized for the workload (a
    prompt is at most 40 words)."""
    from omnistage.config import EngineConfig

    per_request = math.ceil((40 * 4 + max(r.max_tokens for r in requests) + 8) / 16)
    kwargs: dict[str, Any] = {
        "model": model,
        "dtype": dtype,
        "seed": 0,
        "max_num_seqs": max(len(requests), 1),
        "max_model_len": per_request * 16,
        "num_kv_blocks": per_request * len(requests) + 8,
        "block_size": 16,
        "async_scheduling": config in ("async", "spec"),
        "executor_backend": "thread" if config in ("async", "spec") else "inline",
    }
    if config == "spec":
        kwargs["speculative_config"] = dict(SPECULATIVE)
    return EngineConfig(**kwargs)


@contextmanager
def text_engine(
    model: str, config: str, requests: list[VerifyRequest], dtype: str
) -> Iterator[Any]:
    from omnistage.engine.llm_engine import LLMEngine

    engine = LLMEngine(engine_config(model, config, requests, dtype))
    try:
        yield engine
    finally:
        engine.shutdown()


def takes_drafts(engine: Any) -> bool:
    """Whether the engine's model can speculate (one that samples extra codes per token
    cannot)."""
    runner = getattr(engine.core.executor, "runner", None)
    return getattr(getattr(runner, "model", None), "num_token_codes", 0) == 0


def params_of(request: VerifyRequest) -> Any:
    from omnistage.sampling_params import SamplingParams

    return SamplingParams(
        temperature=request.temperature,
        seed=request.seed,
        max_tokens=request.max_tokens,
        ignore_eos=True,
    )


def run_batched(engine: Any, config: str, requests: list[VerifyRequest]) -> RunResult:
    """Every request at once; the aborted ones ended after `abort_after` tokens."""
    result = RunResult(config, stages=[STAGE])
    by_key = {r.key: r for r in requests}
    for request in requests:
        engine.add_request(request.key, request.prompt, params_of(request))
    _drive(engine, by_key, result)
    result.leaks = engine_leaks(engine)
    return result


def run_alone(engine: Any, requests: list[VerifyRequest]) -> RunResult:
    """Each request not aborted in the workload, by itself (nothing else in the batch)."""
    result = RunResult("alone", stages=[STAGE])
    for request in requests:
        if request.abort_after is None:
            engine.add_request(request.key, request.prompt, params_of(request))
            _drive(engine, {request.key: request}, result)
    result.aborted = {r.key for r in requests if r.abort_after is not None}
    result.leaks = engine_leaks(engine)
    return result


def _drive(engine: Any, by_key: dict[str, VerifyRequest], result: RunResult) -> None:
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            completion = out.outputs[0]
            after = by_key[out.request_id].abort_after
            if after is not None and not out.finished and len(completion.token_ids) >= after:
                engine.abort_request(out.request_id)
                result.aborted.add(out.request_id)
            elif out.finished and out.request_id not in result.aborted:
                trace = StageTrace(list(completion.token_ids), completion.finish_reason)
                result.traces[out.request_id] = {STAGE: trace}
        steps += 1
        if steps > MAX_STEPS:
            raise RuntimeError(f"the workload did not finish in {MAX_STEPS} steps")


def engine_leaks(engine: Any) -> dict[str, float]:
    """Every counter of the engine that is not back at rest (empty: nothing leaked)."""
    core = engine.core
    runner = core.executor.runner_stats()
    held = {
        "kv_blocks_used": engine.num_usable_kv_blocks() - engine.num_free_kv_blocks(),
        "waiting": len(core.scheduler.waiting),
        "running": len(core.scheduler.running),
        "unfinished": core.scheduler.num_unfinished_requests,
        "batches_in_flight": len(core.batch_queue),
        "kv_manager_requests": engine.kv_cache_manager.num_requests,
        "runner_batch_rows": runner.get("batch_rows", 0),
        "runner_requests": runner.get("requests", 0),
        "engine_requests": engine.num_unfinished_requests,
    }
    return {f"{STAGE}.{k}": v for k, v in held.items() if v}
