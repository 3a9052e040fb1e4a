"""`InputBatch`, the runner's row-indexed request state, against a plain model of it: rows
fill from the front and reuse the lowest hole, `condense` moves every per-row value of the
last live rows into the holes, and tokens append per row in order."""

from __future__ import annotations

import random

import pytest

from omnistage.sampling_params import SamplingParams
from omnistage.worker.input_batch import InputBatch, RequestState


def _state(req_id: str, prompt: list[int], output=(), blocks=(), eos=None) -> RequestState:
    return RequestState(
        req_id=req_id,
        prompt_token_ids=list(prompt),
        output_token_ids=list(output),
        sampling_params=SamplingParams(max_tokens=4),
        sample_seed=11,
        block_ids=list(blocks),
        num_computed_tokens=0,
        eos_token_id=eos,
    )


def _rows(batch: InputBatch) -> dict[str, tuple[int, list[int], list[int]]]:
    """Each live request: its row, its tokens and its block ids, read from the arrays."""
    out = {}
    for req_id, row in batch.req_id_to_row.items():
        assert batch.states[row].req_id == req_id
        tokens = batch.token_ids[row, : batch.num_tokens[row]].tolist()
        blocks = batch.block_table[row, : batch.num_blocks[row]].tolist()
        out[req_id] = (row, tokens, blocks)
    return out


def test_a_request_state_reads_one_history_with_its_sampling_row():
    state = _state("a", [1, 2, 3], output=[4], eos=9)
    assert state.num_tokens == 4
    row = state.sampling_row
    assert row.output_token_ids is state.output_token_ids  # the same list, never a copy
    assert row.prompt_token_ids is state.prompt_token_ids
    assert (row.seed, row.eos_token_id, row.req_id) == (11, 9, "a")
    assert row.sampling_params is state.sampling_params
    state.output_token_ids.append(5)
    assert state.num_tokens == 5 and row.output_token_ids[-1] == 5


def test_rows_fill_from_the_front_and_a_hole_is_reused_lowest_first():
    batch = InputBatch(max_num_reqs=4, max_model_len=16, max_blocks_per_req=4)
    rows = [batch.add(_state(f"r{i}", [i + 1] * (i + 1), blocks=[i])) for i in range(4)]
    assert rows == [0, 1, 2, 3] and len(batch) == 4 and batch.num_rows == 4
    with pytest.raises(RuntimeError, match="^input batch is full$"):
        batch.add(_state("r4", [1]))
    batch.remove("r2")
    batch.remove("r0")
    batch.remove("unknown")  # a request the batch never had: nothing happens
    assert len(batch) == 2 and batch.states[0] is None and batch.states[2] is None
    assert batch.add(_state("x", [7, 7], output=[8], blocks=[5, 6])) == 0
    assert batch.add(_state("y", [9])) == 2
    assert _rows(batch)["x"] == (0, [7, 7, 8], [5, 6])
    assert _rows(batch)["y"] == (2, [9], [])  # nothing left of r2's tokens or blocks counted


def test_condense_moves_every_value_of_the_last_live_rows_into_the_holes():
    batch = InputBatch(max_num_reqs=6, max_model_len=8, max_blocks_per_req=3)
    for i in range(6):
        batch.add(
            _state(f"r{i}", [10 * i + 1, 10 * i + 2][: 1 + i % 2], blocks=[i, i + 10][: i % 3])
        )
    before = _rows(batch)
    for gone in ("r1", "r3", "r5"):
        batch.remove(gone)
    batch.condense()
    after = _rows(batch)
    assert batch.num_rows == 3 and sorted(r for r, _, _ in after.values()) == [0, 1, 2]
    assert after["r0"][0] == 0 and after["r4"][0] == 1 and after["r2"][0] == 2
    for req_id, (_, tokens, blocks) in after.items():
        assert (tokens, blocks) == before[req_id][1:]
    assert batch.states[3:] == [None, None, None]
    assert batch.add(_state("new", [3])) == 3  # no hole is remembered after condensing


def test_append_tokens_and_blocks_extend_each_row_in_order():
    batch = InputBatch(max_num_reqs=3, max_model_len=10, max_blocks_per_req=4)
    for i, req_id in enumerate("abc"):
        batch.add(_state(req_id, [i + 1], blocks=[i]))
    batch.append_tokens([], [])
    batch.append_tokens([0, 1, 2], [5, 6, 7])  # a decode step: one token per row
    batch.append_tokens([2, 2, 0, 1, 1, 1], [8, 9, 10, 11, 12, 13])  # several per row
    batch.append_blocks(1, [7, 8])
    batch.append_blocks(1, [9])
    rows = _rows(batch)
    assert rows["a"] == (0, [1, 5, 10], [0])
    assert rows["b"] == (1, [2, 6, 11, 12, 13], [1, 7, 8, 9])
    assert rows["c"] == (2, [3, 7, 8, 9], [2])


def test_a_random_life_of_the_batch_matches_a_plain_model():
    rng = random.Random(3)
    batch = InputBatch(max_num_reqs=5, max_model_len=64, max_blocks_per_req=16)
    model: dict[str, tuple[list[int], list[int]]] = {}
    for step in range(300):
        op = rng.random()
        if op < 0.25 and len(model) < 5:
            req_id = f"q{step}"
            prompt = [rng.randrange(100) for _ in range(rng.randrange(1, 4))]
            blocks = [rng.randrange(50) for _ in range(rng.randrange(3))]
            batch.add(_state(req_id, prompt, blocks=blocks))
            model[req_id] = (list(prompt), list(blocks))
        elif op < 0.4 and model:
            req_id = rng.choice(sorted(model))
            batch.remove(req_id)
            del model[req_id]
        elif op < 0.5:
            batch.condense()
            assert sorted(batch.req_id_to_row.values()) == list(range(len(model)))
        elif model:
            live = [r for r in sorted(model) if len(model[r][0]) < 40 and len(model[r][1]) < 12]
            chosen = sorted(
                rng.sample(live, rng.randrange(len(live) + 1)), key=batch.req_id_to_row.get
            )
            rows, tokens = [], []
            for req_id in chosen:
                for _ in range(rng.randrange(1, 4)):
                    rows.append(batch.req_id_to_row[req_id])
                    tokens.append(rng.randrange(100))
                    model[req_id][0].append(tokens[-1])
                if rng.random() < 0.3:
                    block = rng.randrange(50)
                    batch.append_blocks(batch.req_id_to_row[req_id], [block])
                    model[req_id][1].append(block)
            batch.append_tokens(rows, tokens)
        assert {r: v[1:] for r, v in _rows(batch).items()} == model
        assert len(batch) == len(model)
