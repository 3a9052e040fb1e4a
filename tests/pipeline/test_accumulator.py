"""The producer's accumulator and the consumer's coordinator, on their own."""

from __future__ import annotations

import pytest
import torch

from omnistage.core.edge_processor import Accumulate, EdgeProcessor
from omnistage.pipeline.accumulator import RequestAccumulator
from omnistage.pipeline.coordinator import InputCoordinator, timeout_message
from omnistage.pipeline.deploy import EdgeSpec
from omnistage.pipeline.processors import get_processor


def edge(transfer: str, processor: str = "hidden_to_embeds", **kw) -> EdgeSpec:
    args = {"chunk_size": 3, "first_chunk_size": 1, "left_context": 0} | kw
    return EdgeSpec(
        src="a", dst="b", processor=processor, transfer=transfer, connector="shm", **args
    )


def accumulator(*edges: EdgeSpec) -> RequestAccumulator:
    return RequestAccumulator(
        "r1", "a", [5, 6, 7], [(e, get_processor(e.processor)) for e in edges]
    )


def hidden(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.float64)[:, None].repeat(1, 4)


def test_hidden_states_are_collected_once_per_position_even_after_recompute():
    acc = accumulator(edge("payload"))
    acc.add_step([], hidden(0, 2), 0)  # a prompt chunk
    acc.add_step([11], hidden(2, 1), 2)  # rest of the prompt, first token
    acc.add_step([12], hidden(3, 1), 3)
    acc.add_step([13], hidden(0, 5), 0)  # preempted and recomputed: positions 0..4 again
    ((edge_spec, index, payload, last),) = acc.final_payloads()
    assert index == 0 and last and payload["meta.finished"] is True
    assert payload["hidden_states.output"][:, 0].tolist() == [0, 1, 2, 3, 4]
    assert payload["ids.output"].tolist() == [11, 12, 13]
    assert payload["ids.prompt"].tolist() == [5, 6, 7]


def test_a_gap_in_positions_is_a_bug_not_silently_skipped():
    acc = accumulator(edge("payload"))
    acc.add_step([], hidden(0, 2), 0)
    with pytest.raises(RuntimeError, match="jump from position 2 to 3"):
        acc.add_step([1], hidden(3, 1), 3)


def test_stream_chunks_have_exact_sizes_whatever_the_step_sizes():
    acc = accumulator(edge("stream", "ids_to_codes"))
    got = []
    for tokens in ([1, 2], [3], [4, 5, 6, 7, 8], [9]):  # uneven steps (e.g. speculative)
        acc.add_step(tokens, None, 0)
        got += acc.ready_chunks()
    got += acc.final_payloads()
    assert [p["ids.output"].tolist() for _, _, p, _ in got] == [[1], [2, 3, 4], [5, 6, 7], [8, 9]]
    assert [i for _, i, _, _ in got] == [0, 1, 2, 3]
    assert [last for *_, last in got] == [False, False, False, True]


@pytest.mark.parametrize(
    ("growth", "cap", "sizes"),
    [
        (2, 8, [1, 2, 4, 8, 8, 8, 3]),  # CosyVoice's growing hop
        (3, None, [1, 2, 6, 18, 7]),  # no cap
        (1, 8, [1] + [2] * 16 + [1]),  # fixed
    ],
)
def test_stream_chunks_grow_by_the_edges_factor_up_to_its_cap(growth, cap, sizes):
    acc = accumulator(
        edge("stream", "ids_to_codes", chunk_size=2, chunk_growth=growth, max_chunk_size=cap)
    )
    got = []
    for token in range(1, 35):  # one token a step
        acc.add_step([token], None, 0)
        got += acc.ready_chunks()
    got += acc.final_payloads()
    chunks = [p["ids.output"].tolist() for _, _, p, _ in got]
    assert [len(c) for c in chunks] == sizes
    assert [t for c in chunks for t in c] == list(range(1, 35))


def test_stream_last_chunk_may_be_empty():
    acc = accumulator(edge("stream", "ids_to_codes", first_chunk_size=2, chunk_size=2))
    acc.add_step([1, 2], None, 0)
    chunks = acc.ready_chunks() + acc.final_payloads()
    assert [p["ids.output"].tolist() for _, _, p, _ in chunks] == [[1, 2], []]


def test_a_stage_set_value_rides_every_chunk_of_the_edges_that_collect_it():
    from omnistage.core.edge_processor import IMAGE_GRID_KEY
    from omnistage.core.payload import validate_payload

    grid = torch.tensor([[1, 4, 6]])
    acc = accumulator(edge("stream", "qwen3_omni_thinker_to_talker", chunk_size=1), edge("payload"))
    assert acc.set_value(IMAGE_GRID_KEY, torch.tensor([[1, 2, 2]]))
    assert acc.set_value(IMAGE_GRID_KEY, grid)  # REPLACE: the latest value wins
    acc.add_step([], hidden(0, 3), 0)
    acc.add_step([11], hidden(3, 1), 3)
    acc.add_step([12], hidden(4, 1), 4)
    chunks = acc.ready_chunks() + acc.final_payloads()
    talker = [p for e, _, p, _ in chunks if e.processor == "qwen3_omni_thinker_to_talker"]
    assert len(talker) == 3
    for payload in talker:
        assert payload[IMAGE_GRID_KEY] is grid
        validate_payload(payload, where="test")
    (other,) = [p for e, _, p, _ in chunks if e.processor == "hidden_to_embeds"]
    assert IMAGE_GRID_KEY not in other
    assert other["ids.output"].tolist() == [11, 12]  # while CONCAT keys concatenate
    # No edge collects it: ignored. A CONCAT key cannot be set.
    assert not accumulator(edge("payload")).set_value(IMAGE_GRID_KEY, grid)
    with pytest.raises(ValueError, match="collected by concat"):
        acc.set_value("ids.output", torch.tensor([1]))


class PromptIdsByConcat(EdgeProcessor):
    """Collects a REPLACE key of `hidden_to_embeds` (and of every thinker -> talker edge)
    the other way."""

    name = "test_prompt_ids_by_concat"
    accumulate = {"ids.prompt": Accumulate.CONCAT}


class OutputIdsByReplace(EdgeProcessor):
    name = "test_output_ids_by_replace"
    accumulate = {"ids.output": Accumulate.REPLACE}


def test_two_edges_collecting_one_key_two_ways_fail_when_the_deploy_loads(monkeypatch):
    """The producer keeps one copy of each key for all its edges: no edge may silently win."""
    from omnistage.pipeline import processors
    from omnistage.pipeline.deploy import DeployError, load_deploy

    named = r"'ids\.prompt'.*replace on edge a->b \(hidden_to_embeds\).*concat on edge a->c"
    edges = [(edge("payload"), get_processor("hidden_to_embeds"))]
    conflicting = EdgeSpec(
        src="a", dst="c", processor=PromptIdsByConcat.name, transfer="payload", connector="shm"
    )
    with pytest.raises(ValueError, match=named) as info:
        RequestAccumulator("r1", "a", [5], [*edges, (conflicting, PromptIdsByConcat())])
    assert str(info.value).endswith("; a producer collects a key one way for all its edges")
    monkeypatch.setitem(processors._GENERIC, PromptIdsByConcat.name, PromptIdsByConcat)
    stages = [{"id": i, "name": n, "kind": "ar"} for i, n in enumerate("abc")]
    stages[2] |= {"final_output": True, "final_output_type": "text"}
    deploy = {
        "stages": stages,
        "edges": [
            {"from": "a", "to": "b", "processor": "hidden_to_embeds", "transfer": "payload"},
            {"from": "a", "to": "c", "processor": PromptIdsByConcat.name, "transfer": "payload"},
        ],
    }
    for e in deploy["edges"]:
        e["connector"] = "shm"
    with pytest.raises(DeployError, match="edges: payload key " + named):
        load_deploy(deploy)
    deploy["edges"][1]["transfer"] = "prompt"  # built by the orchestrator: nothing collected
    del deploy["edges"][1]["connector"]
    assert len(load_deploy(deploy).edges) == 2


def test_a_key_collected_in_a_mode_the_producer_cannot_honour_is_refused():
    """Step keys only concatenate (the accumulator has no REPLACE for them), and keys the
    stage sets only replace: either slip would be a wrong or missing payload mid-request."""
    wrong = edge("payload", OutputIdsByReplace.name)
    with pytest.raises(ValueError) as info:
        RequestAccumulator("r1", "a", [5], [(wrong, OutputIdsByReplace())])
    assert str(info.value) == (
        f"payload key 'ids.output' on edge a->b ({OutputIdsByReplace.name}): collected by "
        "replace, but it comes from every step, so only concat can collect it"
    )
    wrong = edge("payload", PromptIdsByConcat.name)
    with pytest.raises(ValueError) as info:
        RequestAccumulator("r1", "a", [5], [(wrong, PromptIdsByConcat())])
    assert str(info.value) == (
        f"payload key 'ids.prompt' on edge a->b ({PromptIdsByConcat.name}): collected by "
        "concat, but it is set once by the producing stage, so only replace can collect it"
    )


def test_coordinator_parks_until_the_last_chunk_and_times_out():
    now = [100.0]
    coordinator = InputCoordinator(timeout_s=2.0, clock=lambda: now[0])
    coordinator.park("r1", "submit", ["a->b"])
    coordinator.park("r2", "submit", ["a->b"])
    with pytest.raises(ValueError, match="already waiting"):
        coordinator.park("r1", "submit", ["a->b"])
    now[0] += 1.5
    assert coordinator.arrived("r1", "a->b", "chunk0", last=False).waiting_edges == {"a->b"}
    now[0] += 1.0  # r2 has waited 2.5 s; r1 only 1.0 s since its last chunk
    assert coordinator.expired() == [("r2", "a->b")]
    assert coordinator.arrived("r1", "a->b", "chunk1", last=True).waiting_edges == set()
    coordinator.release("r1")
    assert coordinator.num_entries == 0
    assert timeout_message("a->b", 2.0) == "no input from stage a on edge a->b within 2 s"


def test_generation_stage_fails_a_request_whose_input_never_comes(tiny_omni):
    """In-process: the vocoder parks a request, nothing arrives, the wait times out."""
    import time

    from omnistage.pipeline.deploy import load_deploy
    from omnistage.pipeline.messages import RequestFailed, SubmitRequest
    from omnistage.pipeline.stage_process import make_stage_core
    from omnistage.testing.tiny_pipeline import tiny_pipeline_deploy

    deploy = load_deploy(tiny_pipeline_deploy(tiny_omni, input_timeout_s=0.2))
    core = make_stage_core(deploy.stage("vocoder"), deploy, "unittest1")
    try:
        assert core.handle(SubmitRequest(request_id="r1", wait_for=["talker->vocoder"])) == []
        assert core.counters()["coordinator_entries"] == 1
        time.sleep(0.3)
        (failed,) = core.check_timeouts()
        assert isinstance(failed, RequestFailed)
        assert failed.message == "no input from stage talker on edge talker->vocoder within 0.2 s"
        assert core.counters()["coordinator_entries"] == 0
    finally:
        core.shutdown()
