"""A step whose model call raises fails only the request it is pinned on (`step_isolation`).

The runner is made to raise whenever one marked request is in a step — from its first
step, or only once it has decoded a few tokens. Sync and async, with prefix caching
shared between the bad request and good ones: the bad request ends with finish reason
"error", every other request's tokens equal a run without it (float64 tiny model,
exact), the engine holds nothing afterwards, and it serves the next request.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from omnistage import LLM, SamplingParams
from omnistage.core.process_executor import RunnerDied
from omnistage.core.sched_output import SchedulerOutput
from omnistage.core.step_isolation import StepFailed

BAD_MARK = 299
"""The bad request's prompt starts with this token."""
MAX_FAILED_STEPS = 8
"""More failed steps than isolation needs (async: the batch in flight fails too)."""
SHARED = [7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71]


def _prompts() -> list[dict[str, Any]]:
    bodies = [[101, 102, 103], [104, 105], [106, 107, 108, 109], [110], [111, 112]]
    return [{"prompt_token_ids": SHARED + body} for body in bodies]


def _params(n: int) -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0.8 * (i % 2), seed=40 + i, max_tokens=12, ignore_eos=True)
        for i in range(n)
    ]


class FaultyRunner:
    """Wraps the runner's `execute_model`: raises when the bad request is in a step (once the
    runner holds `after` output tokens of it). Counts the steps it failed."""

    def __init__(self, llm: LLM, after: int) -> None:
        self.runner = llm.engine.core.executor.runner
        self.original = self.runner.execute_model
        self.runner.execute_model = self.execute_model
        self.after = after
        self.bad: set[str] = set()
        self.raised = 0

    def execute_model(self, so: SchedulerOutput) -> Any:
        outputs = {}
        for new in so.scheduled_new_reqs:
            if new.prompt_token_ids[0] == BAD_MARK:
                self.bad.add(new.req_id)
            outputs[new.req_id] = len(new.output_token_ids)
        for req_id in self.bad & set(so.num_scheduled_tokens):
            held = self.runner.requests.get(req_id)
            num_outputs = outputs.get(req_id, len(held.output_token_ids) if held else 0)
            if num_outputs >= self.after:
                self.raised += 1
                if self.raised > MAX_FAILED_STEPS:  # a BaseException: never contained
                    pytest.fail(f"the engine failed {self.raised} steps on {req_id}: no isolation")
                raise RuntimeError(f"model failed on {req_id}")
        return self.original(so)


def _engine(path, async_scheduling: bool) -> LLM:
    return LLM(
        str(path),
        dtype="float64",
        async_scheduling=async_scheduling,
        executor_backend="thread" if async_scheduling else "inline",
        enable_prefix_caching=True,
        block_size=4,
        max_model_len=128,
    )


@pytest.fixture(scope="module")
def alone_tokens(tiny_llama_f64) -> list[list[int]]:
    """The good requests' tokens, run without the bad one."""
    llm = _engine(tiny_llama_f64, async_scheduling=False)
    prompts = _prompts()
    outs = llm.generate(prompts, _params(len(prompts)), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("after", [0, 3], ids=["at-prefill", "mid-decode"])
def test_a_failing_request_in_a_batch_fails_alone(
    tiny_llama_f64, alone_tokens, async_scheduling, after
):
    llm = _engine(tiny_llama_f64, async_scheduling)
    faulty = FaultyRunner(llm, after)
    prompts = _prompts()
    bad = {"prompt_token_ids": [BAD_MARK, *SHARED, 120, 121]}
    prompts.insert(2, bad)
    params = _params(len(prompts) - 1)
    params.insert(2, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    outs = llm.generate(prompts, params, use_tqdm=False)

    failed = outs.pop(2).outputs[0]
    assert failed.finish_reason == "error"
    assert len(failed.token_ids) == after  # what it had confirmed before its failing step
    assert [o.outputs[0].token_ids for o in outs] == alone_tokens
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    isolation = llm.engine.core.scheduler.isolation
    # The batch, then the bad one alone (async: the steps in flight after each failed too).
    assert isolation.num_failed_steps == 2 and faulty.raised >= 2
    assert isolation.suspects == []
    assert llm.engine.num_free_kv_blocks() == llm.engine.num_usable_kv_blocks()
    assert llm.engine.core.scheduler.num_unfinished_requests == 0
    again = llm.generate(_prompts()[:1], _params(1), use_tqdm=False)
    assert again[0].outputs[0].token_ids == alone_tokens[0]


def test_a_step_of_one_request_blames_it_at_once(tiny_llama_f64):
    llm = _engine(tiny_llama_f64, async_scheduling=True)
    faulty = FaultyRunner(llm, after=0)
    out = llm.generate([{"prompt_token_ids": [BAD_MARK, 5, 6]}], _params(1), use_tqdm=False)
    assert out[0].outputs[0].finish_reason == "error"
    isolation = llm.engine.core.scheduler.isolation
    assert isolation.num_failed_steps == 1 and faulty.raised >= 1 and isolation.suspects == []
    assert llm.engine.num_free_kv_blocks() == llm.engine.num_usable_kv_blocks()


def test_a_failed_step_of_two_runs_each_alone_and_the_blame_carries_the_cause(
    tiny_llama_f64, alone_tokens, caplog
):
    """Two requests in the failed step (the smallest batch that must be split): the bad one
    is blamed only after it failed alone, with the model's exception as the cause."""
    llm = _engine(tiny_llama_f64, async_scheduling=False)
    FaultyRunner(llm, after=0)
    core, blamed = llm.engine.core, []
    original = core.step

    def step() -> Any:
        try:
            return original()
        except StepFailed as failed:
            blamed.append(failed)
            raise

    core.step = step
    prompts = [_prompts()[0], {"prompt_token_ids": [BAD_MARK, *SHARED]}]
    with caplog.at_level(logging.WARNING, logger="omnistage.core.engine_core"):
        outs = llm.generate(prompts, _params(2), use_tqdm=False)
    assert outs[0].outputs[0].token_ids == alone_tokens[0]
    assert outs[1].outputs[0].finish_reason == "error"
    assert core.scheduler.isolation.num_failed_steps == 2  # the pair, then the bad one alone
    (failed,) = blamed
    assert len(failed.blamed) == 1  # the bad one only
    assert str(failed).startswith("RuntimeError: model failed on")
    assert isinstance(failed.__cause__, RuntimeError)
    warned, blamed_log = caplog.records  # the operator reads what failed and why
    assert warned.getMessage().startswith("a step of 2 requests failed (model failed on")
    assert blamed_log.getMessage() == f"a step failed on request(s) {failed.blamed}"
    assert blamed_log.exc_info[1] is failed.__cause__


def test_n_sequences_of_a_failing_request_each_end_with_error(tiny_llama_f64):
    llm = _engine(tiny_llama_f64, async_scheduling=False)
    FaultyRunner(llm, after=2)
    params = SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=8, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": [BAD_MARK, 5, 6]}], [params], use_tqdm=False)
    assert [c.finish_reason for c in out[0].outputs] == ["error", "error"]
    assert out[0].finished


def test_a_runner_that_is_gone_is_not_contained(tiny_llama_f64):
    """A dead worker cannot run anyone alone: the engine raises instead of blaming."""
    llm = _engine(tiny_llama_f64, async_scheduling=False)

    def dead(so: SchedulerOutput) -> Any:
        raise RunnerDied("model runner worker died: killed by SIGKILL")

    llm.engine.core.executor.runner.execute_model = dead
    with pytest.raises(RunnerDied):
        llm.generate(_prompts()[:2], _params(2), use_tqdm=False)
    assert llm.engine.core.scheduler.isolation.num_failed_steps == 0


def test_blocks_still_held_after_a_failure_stop_the_engine(tiny_llama_f64, monkeypatch):
    """The prefix cache can only be forgotten when nothing is held; if preempting everyone
    left blocks held (a bug), the engine stops rather than serve from garbage KV."""
    llm = _engine(tiny_llama_f64, async_scheduling=False)
    FaultyRunner(llm, after=0)
    monkeypatch.setattr(llm.engine.core.scheduler.kv, "reset_prefix_cache", lambda: False)
    bad = {"prompt_token_ids": [BAD_MARK, 5, 6]}
    with pytest.raises(RuntimeError) as err:
        llm.generate([bad], _params(1), use_tqdm=False)
    assert str(err.value) == "KV blocks still held after preempting every request"
    assert str(err.value.__cause__).startswith("model failed on")


def test_step_failed_names_the_cause():
    from omnistage.core.step_isolation import StepFailed

    failed = StepFailed(["a"], ValueError("bad rows"))
    assert str(failed) == "ValueError: bad rows" and failed.blamed == ["a"]


def test_a_suspect_that_sampled_a_token_alone_is_cleared_and_the_next_runs_alone():
    from omnistage.core.engine_core_output import EngineCoreOutput
    from omnistage.core.step_isolation import StepIsolation

    isolation = StepIsolation()
    isolation.suspect(["a", "b", "c"])
    assert isolation.focus({"a", "b", "c"}) == "a"
    assert isolation.admits("a") and not isolation.admits("b")
    isolation.cleared([EngineCoreOutput(request_id="a", new_token_ids=[])])  # a prompt chunk
    assert isolation.suspects == ["a", "b", "c"]
    isolation.cleared([EngineCoreOutput(request_id="a", new_token_ids=[7])])  # not finished
    assert isolation.focus({"a", "b", "c"}) == "b"
    assert isolation.focus({"c"}) == "c"  # b ended meanwhile
    isolation.cleared([EngineCoreOutput(request_id="c", new_token_ids=[], finish_reason="stop")])
    assert isolation.focus(set()) is None and isolation.admits("anyone")


def test_the_token_budget_adds_up_what_it_gave():
    from omnistage.core.token_budget import TokenBudget

    budget = TokenBudget(10)
    budget.take("a", 3)
    budget.take("b", 4, num_spec=2)
    assert (budget.left, budget.used) == (3, 7)
    assert budget.scheduled == {"a": 3, "b": 4} and budget.spec == {"b": 2}


def test_a_request_stops_when_it_fills_the_context_exactly(tiny_llama_f64):
    """(max_tokens is capped at the context's room too, so the stop rule's own
    `num_tokens >= max_model_len` is a second guard: its `>` mutant cannot fail this.)"""
    llm = LLM(str(tiny_llama_f64), dtype="float64", max_model_len=8)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    (out,) = llm.generate([{"prompt_token_ids": [5, 6, 7, 8, 9, 10]}], params, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 2 and out.outputs[0].finish_reason == "length"


def test_a_batch_that_cannot_be_sent_is_contained_like_a_failed_step(tiny_llama_f64, alone_tokens):
    """Async: `submit` itself raising (e.g. the batch could not be sent to the worker) fails
    the request it holds and no one else."""
    llm = _engine(tiny_llama_f64, async_scheduling=True)
    executor = llm.engine.core.executor
    original, bad = executor.submit, set()

    def submit(so: SchedulerOutput) -> Any:
        bad.update(n.req_id for n in so.scheduled_new_reqs if n.prompt_token_ids[0] == BAD_MARK)
        if bad & set(so.num_scheduled_tokens):
            raise BrokenPipeError("could not send the batch")
        return original(so)

    executor.submit = submit
    prompts = _prompts()
    prompts.insert(1, {"prompt_token_ids": [BAD_MARK, 5, 6]})
    params = _params(len(prompts) - 1)
    params.insert(1, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert outs.pop(1).outputs[0].finish_reason == "error"
    assert [o.outputs[0].token_ids for o in outs] == alone_tokens
    assert llm.engine.core.scheduler.isolation.num_failed_steps == 2
    assert llm.engine.num_free_kv_blocks() == llm.engine.num_usable_kv_blocks()
