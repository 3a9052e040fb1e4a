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


def edge(processor: str, transfer: str = "payload", dst: str = "b") -> EdgeSpec:
    return EdgeSpec(
        src="a",
        dst=dst,
        processor=processor,
        transfer=transfer,
        connector="shm",
        chunk_size=2,
        first_chunk_size=1,
    )


def accumulator(
    processor: str, transfer: str = "payload", prompt: list[int] | None = None
) -> RequestAccumulator:
    spec = edge(processor, transfer)
    prompt = [5, 6] if prompt is None else prompt
    return RequestAccumulator("r1", "a", prompt, [(spec, get_processor(processor))])


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
    with pytest.raises(
        RuntimeError,
        match=r"request .r1.: codes.output needs a model that samples codes with each token",
    ):
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
    empty = only_payload(acc)["ids.output"]  # nothing produced
    assert empty.dtype == torch.int64 and empty.shape == (0,)
    acc = accumulator("ids_to_codes", transfer="stream")
    for token in (1, 2, 3, 4):
        acc.add_step([token], None, 0)
    chunks = acc.ready_chunks() + acc.final_payloads()
    assert [p["ids.output"].tolist() for _, _, p, _ in chunks] == [[1], [2, 3], [4]]
    assert all(p["ids.output"].is_contiguous() for _, _, p, _ in chunks)


def test_an_empty_prompt_is_still_int64_ids():
    prompt = only_payload(accumulator("hidden_to_embeds", prompt=[]))["ids.prompt"]
    assert prompt.dtype == torch.int64 and prompt.shape == (0,)


def test_a_payload_edge_listed_first_does_not_hold_back_a_stream_edge():
    pairs = [(e, get_processor(e.processor)) for e in (edge("ids_to_codes", dst="b"),)]
    pairs.append((edge("ids_to_codes", "stream", dst="c"), get_processor("ids_to_codes")))
    acc = RequestAccumulator("r1", "a", [5], pairs)
    acc.add_step([1, 2, 3], None, 0)
    ready = acc.ready_chunks()
    assert [(e.dst, p["ids.output"].tolist()) for e, _, p, _ in ready] == [
        ("c", [1]),
        ("c", [2, 3]),
    ]


def test_every_collected_key_of_a_stream_is_cut_without_repeats():
    # hidden_to_embeds streams by ids.output and also concatenates hidden rows: each
    # chunk carries the hidden rows produced since the previous one, none twice.
    acc = accumulator("hidden_to_embeds", transfer="stream")
    chunks = []
    for position in range(5):
        acc.add_step([position + 10], torch.full((1, 2), float(position)), position)
        chunks += acc.ready_chunks()
    chunks += acc.final_payloads()
    rows = [p["hidden_states.output"][:, 0].tolist() for _, _, p, _ in chunks]
    assert sum(rows, []) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [p["ids.output"].tolist() for _, _, p, _ in chunks] == [[10], [11, 12], [13, 14], []]
