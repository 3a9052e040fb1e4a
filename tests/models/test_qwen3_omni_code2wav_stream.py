"""Qwen3-Omni's code2wav over a stream's chunks (`code2wav_stream.py`): each frame decoded
once, after the stream's kept state (no left context decoded again), every chunk giving
the samples its frames complete, so the chunks add up to the whole decode however they
are cut, also when the talker's end frame lands in a chunk; two chunks of a stream in one
call decode in order; a failed call leaves the stream as it was."""

from __future__ import annotations

import pytest
import torch

from omnistage.families.qwen3_omni import code2wav as code2wav_module
from omnistage.families.qwen3_omni.tiny import make_tiny_qwen3_omni
from omnistage.families.qwen3_omni.tiny_config import CODEBOOK_SIZE, CODEC_IDS, NUM_CODE_GROUPS
from omnistage.models.generation import GenerationItem, load_generation_model
from tests.models.stream_items import (
    assert_a_failed_call_leaves_the_stream,
    assert_two_chunks_in_one_call_decode_in_order,
    stream_items,
)


@pytest.fixture(scope="module")
def vocoder(tmp_path_factory):
    ckpt = make_tiny_qwen3_omni(tmp_path_factory.mktemp("q3o-stream"), dtype=torch.float64)
    model = load_generation_model(ckpt, torch.float64, part="code2wav")
    assert model.streams  # the released layout streams
    return model


def codes(frames: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CODEBOOK_SIZE, (frames, NUM_CODE_GROUPS), generator=g)


@pytest.mark.parametrize("chunks", [[2, 8, 8, 8, 8, 6], [1] * 40, [39, 1], [3, 7, 1, 29]])
def test_stream_chunks_add_up_to_the_whole_decode(vocoder, chunks):
    frames = codes(40, seed=1)
    (whole,) = vocoder.generate([GenerationItem(frames)])
    pieces = [vocoder.generate([item])[0] for item in stream_items(frames, chunks)]
    streamed = torch.cat(pieces)
    assert streamed.shape == whole.shape
    torch.testing.assert_close(streamed, whole, rtol=0, atol=1e-12)
    # The same count of samples per chunk as with re-decoded left context (the seam first).
    with_context = stream_items(frames, chunks, left_context=32)
    for item in with_context:
        item.state = None
    counts = [vocoder.generate([item])[0].shape[0] for item in with_context]
    assert [p.shape[0] for p in pieces] == counts
    # Later chunks' left-context rows are not decoded again.
    items = stream_items(frames, chunks, left_context=8)
    for item in items[1:]:
        item.rows[: item.context_len] = (item.rows[: item.context_len] + 1) % CODEBOOK_SIZE
    again = [vocoder.generate([item])[0] for item in items]
    assert all(torch.equal(a, b) for a, b in zip(again, pieces, strict=True))


def test_the_end_frame_in_a_chunk_ends_the_stream_s_audio(vocoder):
    speech = codes(21, seed=2)
    end = codes(1, seed=99)
    end[0, 0] = CODEC_IDS["codec_eos_token_id"]
    frames = torch.cat([speech, end, codes(10, seed=3)])
    (whole,) = vocoder.generate([GenerationItem(speech)])
    items = stream_items(frames, [4, 18, 10])
    for item in items:  # as the stage checks each chunk on arrival, before decoding it
        vocoder.check_item(item)
    pieces = [vocoder.generate([item])[0] for item in items]
    assert pieces[2].numel() == 0  # after the end frame: nothing
    torch.testing.assert_close(torch.cat(pieces), whole, rtol=0, atol=1e-12)


def test_two_chunks_of_a_stream_in_one_call_decode_in_order(vocoder):
    frames = codes(30, seed=4)
    other = stream_items(codes(20, seed=5), [6, 14])
    assert_two_chunks_in_one_call_decode_in_order(
        vocoder, lambda: stream_items(frames, [6, 12, 12]), other
    )


def test_a_failed_call_leaves_the_stream_as_it_was(vocoder, monkeypatch):
    # The transformer's cache has grown when the second decode fails.
    frames = codes(24, seed=6)
    assert_a_failed_call_leaves_the_stream(
        vocoder,
        monkeypatch,
        code2wav_module,
        "decode_chunk",
        lambda: stream_items(frames, [8, 8, 8]),
    )
