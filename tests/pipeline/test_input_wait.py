"""WAITING_FOR_INPUT on an AR consumer: a request submitted before its input is parked in
the stage's coordinator (no engine request, no KV blocks) until its payload arrives, then
runs; a stream-fed request runs from its first chunk and stays parked for the rest; a wait
that outlasts `input_timeout_s` fails the request with a clear reason and frees all it held."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from omnistage.pipeline.deploy import load_deploy
from omnistage.pipeline.messages import RequestFailed, StageOutput, SubmitRequest
from omnistage.pipeline.stage_process import make_stage_core
from omnistage.testing.tiny_pipeline import tiny_pipeline_deploy

EDGE = "thinker->talker"


@pytest.fixture
def talker(tiny_omni, request):
    data = tiny_pipeline_deploy(
        tiny_omni, thinker_transfer=request.param, input_timeout_s=0.3, talker_tokens=5
    )
    deploy = load_deploy(data)
    core = make_stage_core(deploy.stage("talker"), deploy, f"inputwait{request.param}")
    yield core
    core.shutdown()


def payload(num_prompt: int, num_rows: int, hidden: int = 64) -> dict:
    return {
        "ids.prompt": torch.arange(5, 5 + num_prompt),
        "ids.output": torch.arange(40, 40 + num_rows),
        "hidden_states.output": torch.randn(num_rows, hidden, dtype=torch.float64),
    }


def deliver(core, index: int, last: bool, data: dict) -> list:
    msg = SimpleNamespace(request_id="r", edge=EDGE, chunk_index=index, last=last)
    return core.on_input(msg, data)


def held(core) -> dict[str, int]:
    counters = core.counters()
    return {k: counters[k] for k in ("coordinator_entries", "engine_requests", "kv_blocks_used")}


def run_to_end(core) -> list[int]:
    tokens: list[int] = []
    for _ in range(100):
        for event in core.step():
            assert isinstance(event, StageOutput), event
            tokens += event.new_token_ids
            if event.finished:
                return tokens
    raise AssertionError("the request did not finish")


@pytest.mark.parametrize("talker", ["payload"], indirect=True)
def test_a_parked_request_holds_nothing_in_the_engine_until_its_payload_comes(talker):
    assert talker.handle(SubmitRequest(request_id="r", wait_for=[EDGE], send_to=[])) == []
    assert talker.coordinator.is_waiting("r")
    assert held(talker) == {"coordinator_entries": 1, "engine_requests": 0, "kv_blocks_used": 0}
    assert talker.gauges()["num_waiting"] == 1 and talker.gauges()["num_running"] == 0
    assert talker.step() == [] and not talker.has_work()
    assert deliver(talker, 0, True, payload(3, 4)) == []
    assert held(talker)["coordinator_entries"] == 0 and held(talker)["engine_requests"] == 1
    assert len(run_to_end(talker)) == 5
    assert set(held(talker).values()) == {0}


@pytest.mark.parametrize("talker", ["payload"], indirect=True)
def test_a_parked_request_whose_payload_never_comes_fails_clearly(talker):
    talker.handle(SubmitRequest(request_id="r", wait_for=[EDGE], send_to=[]))
    assert talker.check_timeouts() == []  # not yet
    time.sleep(0.35)
    (failed,) = talker.check_timeouts()
    assert isinstance(failed, RequestFailed) and failed.request_id == "r"
    assert failed.message == "no input from stage thinker on edge thinker->talker within 0.3 s"
    assert set(held(talker).values()) == {0}
    assert deliver(talker, 0, True, payload(3, 4)) == []  # too late: dropped


@pytest.mark.parametrize("talker", ["stream"], indirect=True)
def test_a_stream_fed_request_runs_from_its_first_chunk_and_waits_for_the_rest(talker):
    talker.handle(SubmitRequest(request_id="r", wait_for=[EDGE], send_to=[]))
    deliver(talker, 0, False, payload(3, 2))  # the prompt: no conditioning rows yet
    assert held(talker)["engine_requests"] == 1 and talker.coordinator.is_waiting("r")
    first = [t for e in talker.step() for t in e.new_token_ids]
    assert len(first) == 1  # the token after the prompt; the next position needs a row
    gauges = talker.gauges()  # it runs, though its stream is still owed
    assert (gauges["num_waiting"], gauges["num_running"]) == (0, 1)
    for _ in range(3):
        assert talker.step() == []
    deliver(talker, 1, True, {"hidden_states.output": torch.randn(2, 64, dtype=torch.float64)})
    assert not talker.coordinator.is_waiting("r")
    assert len(first + run_to_end(talker)) == 5
    assert set(held(talker).values()) == {0}


@pytest.mark.parametrize("talker", ["stream"], indirect=True)
def test_a_stream_that_stalls_fails_the_request_and_frees_its_kv(talker):
    talker.handle(SubmitRequest(request_id="r", wait_for=[EDGE], send_to=[]))
    deliver(talker, 0, False, payload(3, 2))
    talker.step()
    assert held(talker)["kv_blocks_used"] > 0
    time.sleep(0.35)
    (failed,) = talker.check_timeouts()
    assert failed.message == "no input from stage thinker on edge thinker->talker within 0.3 s"
    talker.step()  # the engine lets the runner drop it
    assert set(held(talker).values()) == {0}
