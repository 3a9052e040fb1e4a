"""What the producer's accumulator keeps of each accepted step, row by row.

Written against the mutants `make mutation` found alive in `pipeline/accumulator.py`
(docs/testing.md): codec frames, dtypes, empty steps, hidden rows copied off the
producer's buffers, and the refusal of a step without its codes.
"""

from __future__ import annotations

import pytest
import torch

from omnistage.pipeline.accumulator import RequestAccumulator
from omnistage.pipeline.deploy import EdgeSpec
from omnistage.pipeline.processors import get_processor


def accumulator(processor: str, transfer: str = "payload") -> RequestAccumulator:
    spec = EdgeSpec(
        src="a",
        dst="b",
        processor=processor,
        transfer=transfer,
        connector="shm",
        chunk_size=2,
        first_chunk_size=1,
    )
    return RequestAccumulator("r1", "a", [5, 6], [(spec, get_processor(processor))])


def only_payload(acc: RequestAccumulator) -> dict:
    ((_, _, payload, _),) = acc.final_payloads()
    return payload


def test_codec_frames_are_each_token_followed_by_its_codes_as_int64():
    acc = accumulator("codec_frames")
    acc.add_step([7], None, 0, [[1, 2, 3]])
    acc.add_step([], None, 0, None)  # a step that produced no token adds no frame
    acc.add_step([8, 9], None, 0, [[4, 5, 6], [0, 0, 1]])
    frames = only_payload(acc)["codes.output"]
    assert frames.dtype == torch.int64
    assert frames.tolist() == [[7, 1, 2, 3], [8, 4, 5, 6], [9, 0, 0, 1]]


@pytest.mark.parametrize("codes", [None, [], [[1, 2, 3]]], ids=["none", "empty", "one-short"])
def test_a_token_without_its_codes_is_refused_by_request(codes):
    acc = accumulator("codec_frames")
    with pytest.raises(RuntimeError, match=r"request 'r1': codes.output needs a model that sam"):
        acc.add_step([7, 8], None, 0, codes)
    assert acc.counts["codes.output"] == 0


def test_output_ids_are_int64_and_an_empty_step_adds_nothing():
    acc = accumulator("ids_to_codes")
    acc.add_step([], None, 0)
    assert acc.rows["ids.output"] == []
    acc.add_step([3, 4], None, 0)
    ids = only_payload(acc)["ids.output"]
    assert ids.dtype == torch.int64 and ids.tolist() == [3, 4]


def test_a_key_no_edge_collects_is_not_kept():
    acc = accumulator("ids_to_codes")  # collects ids.output only
    acc.add_step([3], torch.ones(1, 4), 0, [[1]])
    assert set(acc.rows) == {"ids.output"}
    assert not acc.wants_hidden_states


def test_hidden_rows_are_copied_off_the_producers_buffer():
    acc = accumulator("hidden_to_embeds")
    buffer = torch.arange(8, dtype=torch.float64).reshape(2, 4)
    acc.add_step([], buffer, 0)
    acc.add_step([1], None, 2)  # no hidden rows this step (e.g. a stage that skips them)
    buffer.zero_()  # the producer reuses its buffer for the next step
    hidden = only_payload(acc)["hidden_states.output"]
    assert hidden.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert hidden.device.type == "cpu"


def test_rows_already_held_are_not_appended_again():
    acc = accumulator("hidden_to_embeds")
    acc.add_step([], torch.zeros(3, 4), 0)
    acc.add_step([1], torch.ones(2, 4), 1)  # positions 1, 2 recomputed: nothing new
    assert len(acc.rows["hidden_states.output"]) == 1
    assert acc.counts["hidden_states.output"] == 3


def test_a_chunk_is_a_slice_of_the_rows_in_order_and_an_empty_key_is_int64():
    acc = accumulator("ids_to_codes", transfer="stream")
    assert only_payload(acc)["ids.output"].dtype == torch.int64  # nothing produced
    acc = accumulator("ids_to_codes", transfer="stream")
    for token in (1, 2, 3, 4):
        acc.add_step([token], None, 0)
    chunks = acc.ready_chunks() + acc.final_payloads()
    assert [p["ids.output"].tolist() for _, _, p, _ in chunks] == [[1], [2, 3], [4]]
    assert all(p["ids.output"].is_contiguous() for _, _, p, _ in chunks)
