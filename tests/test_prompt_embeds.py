"""Requests that bring prompt embeddings, and per-step hidden states out of the engine."""

from __future__ import annotations

import pytest
import torch

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.engine.llm_engine import LLMEngine

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def make_engine(path, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), dtype="float64", async_scheduling=False, **kw))


def drain(engine: LLMEngine) -> dict[str, list[int]]:
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    return done


def token_embeddings(engine: LLMEngine, ids: list[int]) -> torch.Tensor:
    runner = engine.core.executor.runner
    return runner.model.embed_input_ids(torch.tensor(ids)).clone()


def test_prompt_embeds_equal_to_token_embeddings_give_the_same_tokens(tiny_llama_f64):
    engine = make_engine(tiny_llama_f64, enable_prefix_caching=False)
    ids = list(range(40, 90))
    engine.add_tokenized_request("plain", None, ids, GREEDY)
    engine.add_tokenized_request("embeds", None, ids, GREEDY, token_embeddings(engine, ids))
    other = token_embeddings(engine, ids) + 0.5
    engine.add_tokenized_request("shifted", None, ids, GREEDY, other)
    done = drain(engine)
    assert done["embeds"] == done["plain"]
    assert done["shifted"] != done["plain"]


def test_prefix_cache_only_shares_blocks_of_equal_embeddings(tiny_llama_f64):
    engine = make_engine(tiny_llama_f64)
    ids = list(range(40, 90))
    embeds = token_embeddings(engine, ids)
    kv = engine.kv_cache_manager
    engine.add_tokenized_request("a", None, ids, GREEDY, embeds)
    drain(engine)
    hits = kv.prefix_hits
    engine.add_tokenized_request("b", None, ids, GREEDY, embeds + 1.0)  # same ids, other embeds
    drain(engine)
    assert kv.prefix_hits == hits
    engine.add_tokenized_request("c", None, ids, GREEDY, embeds.clone())  # equal embeds
    drain(engine)
    assert kv.prefix_hits > hits


@pytest.mark.parametrize(
    ("embeds", "match"),
    [
        (torch.zeros(3, 64), r"prompt_embeds: expected shape \(4, 64\)"),
        (torch.zeros(4, 65), r"prompt_embeds: expected shape \(4, 64\)"),
        (torch.zeros(4, 64, dtype=torch.long), "floating-point"),
    ],
)
def test_bad_prompt_embeds_are_refused(tiny_llama_f64, embeds, match):
    engine = make_engine(tiny_llama_f64)
    with pytest.raises(ValueError, match=match):
        engine.add_tokenized_request("x", None, [5, 6, 7, 8], GREEDY, embeds)
    assert not engine.has_unfinished_requests()


def test_hidden_states_cover_every_computed_position_once(tiny_llama_f64):
    """Chunked prefill: the hidden rows reported per step tile positions 0..n-2 exactly."""
    engine = make_engine(tiny_llama_f64, output_hidden_states=True, max_num_batched_tokens=16)
    seen: dict[str, list[tuple[int, int]]] = {}
    engine.core_output_listener = lambda rid, out: seen.setdefault(rid, []).append(
        (out.hidden_start, out.hidden_states.shape[0])
    )
    engine.add_tokenized_request("r", None, list(range(40, 90)), GREEDY)
    drain(engine)
    spans = seen["r"]
    assert spans[0][0] == 0
    for (start, n), (next_start, _) in zip(spans, spans[1:], strict=False):
        assert next_start == start + n
    assert sum(n for _, n in spans) == 50 + 8 - 1
