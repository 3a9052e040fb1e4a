"""A request's results collect streamed output in amortized O(n): every update's snapshot
is O(1) and keeps showing what it showed, and the bytes copied to collect a stream stay a
small multiple of its size (concatenating all so far at each chunk copies O(n^2))."""

from __future__ import annotations

import asyncio

import pytest
import torch

from omnistage.pipeline.outputs import StageResult
from omnistage.pipeline.row_buffer import RowBuffer
from omnistage.testing.tiny_pipeline import tiny_pipeline_deploy


def test_row_buffer_copies_each_row_a_bounded_number_of_times():
    buffer = RowBuffer()
    chunks = [torch.full((7,), float(i)) for i in range(1000)]
    views = []
    for chunk in chunks:
        buffer.append(chunk)
        views.append(buffer.view())
    total = sum(c.numel() * c.element_size() for c in chunks)
    assert buffer.bytes_copied <= 3 * total  # re-concatenating would copy ~500x total
    assert torch.equal(buffer.view(), torch.cat(chunks))
    for i in (0, 1, 500, 999):  # earlier views still hold what they held
        assert torch.equal(views[i], torch.cat(chunks[: i + 1]))


def test_row_buffer_keeps_trailing_dims_and_refuses_what_does_not_continue():
    buffer = RowBuffer()
    assert buffer.view() is None
    image = torch.randint(0, 255, (4, 5, 3), dtype=torch.uint8)
    buffer.append(image)
    assert torch.equal(buffer.view(), image) and buffer.bytes_copied == image.numel()
    with pytest.raises(ValueError, match=r"shape \[2, 6, 3\].*\[\*, 5, 3\]"):
        buffer.append(torch.zeros(2, 6, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="torch.float32"):
        buffer.append(torch.zeros(2, 5, 3))
    with pytest.raises(ValueError, match="scalar"):
        buffer.append(torch.tensor(1.0))


def test_snapshots_are_constant_and_cheap():
    result = StageResult("thinker", "text")
    snapshots = []
    for i in range(300):
        result.add([i], f"t{i} ", torch.full((3,), float(i)))
        snapshots.append(result.snapshot())
    result.finished = True
    first, middle, last = snapshots[0], snapshots[149], snapshots[-1]
    assert (first.token_ids, first.text, first.data.tolist()) == ([0], "t0 ", [0.0] * 3)
    assert middle.token_ids == list(range(150))
    assert middle.text == "".join(f"t{i} " for i in range(150))
    assert torch.equal(middle.data, torch.arange(150.0).repeat_interleave(3))
    assert last.token_ids == list(range(300)) and not last.finished
    assert middle.text == "".join(f"t{i} " for i in range(150))  # read again, after a longer one
    assert result.bytes_copied <= 3 * 300 * 3 * 4
    result.add([], "", None)  # nothing new: nothing changes
    assert result.snapshot().token_ids == list(range(300))


def test_streamed_audio_is_collected_in_linear_copies(tiny_omni):
    """Through the pipeline: 60 audio chunks, a snapshot with every update; the final
    result copied its rows a bounded number of times (the quadratic way: ~30x)."""
    from omnistage.pipeline.omni import AsyncOmni

    deploy = tiny_pipeline_deploy(tiny_omni, talker_tokens=60, chunk_size=1, first_chunk_size=1)
    omni = AsyncOmni(deploy, in_process=True)

    async def collect():
        return [u async for u in omni.generate("many chunks")]

    try:
        updates = asyncio.run(collect())
    finally:
        omni.shutdown()
    final = updates[-1]
    assert final.error is None
    audio_updates = [u for u in updates if u.new_data is not None]
    assert len(audio_updates) > 50
    result = final.outputs["vocoder"]
    assert result.bytes_copied <= 3 * result.data.numel() * result.data.element_size()
    seen = 0
    for update in audio_updates:  # each update's snapshot: the audio up to that update
        seen += update.new_data.shape[0]
        assert update.outputs["vocoder"].data.shape[0] == seen
        assert torch.equal(update.outputs["vocoder"].data, result.data[:seen])


def test_an_audio_stage_that_finished_without_a_sample_has_empty_audio():
    """Speech that came out empty (a talker that ended at its first frame) is an empty
    waveform, whole as streamed: the chat and speech endpoints answer it, not a 500."""
    from omnistage.pipeline.outputs import OmniRequestOutput

    result = StageResult("code2wav", "audio", sample_rate=24000)
    out = OmniRequestOutput("r", {"code2wav": result})
    assert out.audio is None  # not finished yet: nothing to say
    result.finished = True
    assert out.audio is not None and out.audio.shape == (0,) and out.sample_rate == 24000
