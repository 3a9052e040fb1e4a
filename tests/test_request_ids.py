"""A request id already in use is refused up front, naming it, and the request that holds
it runs on untouched (`LLMEngine.add_request`: ValueError). An n > 1 request's sequences
run in the core as "{i}_{id}": an id that clashes with one of those is refused the same
way, before anything is registered. (The pipeline's ids: tests/pipeline/
test_pipeline_request_ids.py.)"""

from __future__ import annotations

import re

import pytest

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.engine.llm_engine import LLMEngine

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
TWO = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=6, ignore_eos=True)
PROMPT = {"prompt_token_ids": [5, 6, 7, 8]}
OTHER = {"prompt_token_ids": [9, 10]}


@pytest.fixture(scope="module")
def engine(tiny_llama_f64):
    config = EngineConfig(
        model=str(tiny_llama_f64), dtype="float64", async_scheduling=False, max_model_len=64
    )
    made = LLMEngine(config)
    yield made
    made.shutdown()


def drain(engine: LLMEngine) -> dict[str, list[list[int]]]:
    """Step until nothing is left: each finished request's token ids per sequence."""
    done: dict[str, list[list[int]]] = {}
    for _ in range(100):
        if not engine.has_unfinished_requests():
            return done
        for out in engine.step():
            if out.finished:
                done[out.request_id] = [list(c.token_ids) for c in out.outputs]
    raise AssertionError("the engine did not finish its requests")


@pytest.mark.parametrize(
    ("first", "second", "message"),
    [
        (("x", GREEDY), ("x", GREEDY), "request_id: 'x' is already in use"),
        (("x", TWO), ("x", TWO), "request_id: 'x' is already in use"),
        (("x", TWO), ("0_x", GREEDY), "request_id: '0_x' clashes with the running sequence '0_x'"),
        (("0_x", GREEDY), ("x", TWO), "request_id: 'x' clashes with the running sequence '0_x'"),
    ],
    ids=["same-id", "same-id-n2", "id-of-a-sequence", "sequence-of-an-id"],
)
def test_an_id_in_use_is_refused_and_its_request_runs_on(engine, first, second, message):
    (first_id, first_params), (second_id, second_params) = first, second
    engine.add_request(first_id, PROMPT, first_params)
    expected = drain(engine)
    engine.add_request(first_id, PROMPT, first_params)
    with pytest.raises(ValueError, match=re.escape(message)):
        engine.add_request(second_id, OTHER, second_params)
    assert drain(engine) == expected  # the first request, as if nothing had happened
    assert engine.num_free_kv_blocks() == engine.num_usable_kv_blocks()
    # Once the first has ended, its id is free again.
    engine.add_request(second_id, OTHER, second_params)
    assert list(drain(engine)) == [second_id]
