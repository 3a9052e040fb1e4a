"""The generation stage's work items for a streamed edge: `left_context` rows of the earlier
chunks in front, the last `right_context` rows of each chunk held back until the next chunk
(or the end) brings the rows after them; the items' outputs add up to the whole decode."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from omnistage.core.tensor_blob import blob_to_tensor
from omnistage.models.generation import GenerationItem
from omnistage.pipeline.deploy import load_deploy
from omnistage.pipeline.generation_stage import GenerationStageCore
from omnistage.pipeline.messages import SubmitRequest
from omnistage.testing.tiny_pipeline import tiny_pipeline_deploy

EDGE = "talker->vocoder"


def stage(tiny_omni, left: int, right: int) -> tuple[GenerationStageCore, list[GenerationItem]]:
    """The tiny pipeline's vocoder stage (a causal `TinyCodeVocoder`, receptive field 4
    codes), its model recording every item it decodes."""
    data = tiny_pipeline_deploy(tiny_omni, left_context=left, connector="inproc")
    data["edges"][1]["right_context"] = right
    spec = load_deploy(data)
    vocoder = spec.stage("vocoder").with_part_directory()
    core = GenerationStageCore(vocoder, spec, namespace="tgenstage")
    seen: list[GenerationItem] = []
    generate = core.model.generate

    def recording(items: list[GenerationItem]) -> list[torch.Tensor]:
        seen.extend(items)
        return generate(items)

    core.model.generate = recording
    return core, seen


def feed(core: GenerationStageCore, rid: str, chunks: list[torch.Tensor]) -> list[torch.Tensor]:
    """Deliver `chunks` (the last one marked last) and step the stage after each: the outputs
    in order."""
    assert core.handle(SubmitRequest(request_id=rid, wait_for=[EDGE])) == []
    outputs = []
    for i, rows in enumerate(chunks):
        msg = SimpleNamespace(request_id=rid, edge=EDGE, chunk_index=i, last=i == len(chunks) - 1)
        assert core.on_input(msg, {"ids.output": rows}) == []
        while core.has_work():
            for out in core.step():
                assert out.request_id == rid and out.finished == msg.last
                outputs.append(blob_to_tensor(out.data))
    return outputs


@pytest.mark.parametrize("last_rows", [0, 2])
def test_right_context_is_held_back_until_the_next_chunk(tiny_omni, last_rows):
    core, seen = stage(tiny_omni, left=4, right=3)
    codes = torch.arange(10, 30 + last_rows)  # a code is its row's index + 10
    sizes = [3, 4, 2, 6, 5, last_rows]  # the first chunk is all held back: no item
    bounds = torch.tensor([0, *sizes]).cumsum(0).tolist()
    chunks = [codes[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    outputs = feed(core, "r", chunks)

    # (first row, own start, own end, last row + 1) of each item, in the request's rows.
    n = codes.numel()
    expected = [(0, 0, 4, 7), (0, 4, 6, 9), (2, 6, 12, 15), (8, 12, 17, 20), (13, 17, n, n)]
    got = []
    for item in seen:
        first = item.offset
        got.append((first, first + item.context_len, first + item.own_end, first + len(item.rows)))
        assert torch.equal(item.rows, codes[first : first + len(item.rows)])
        assert item.seed is None  # the tiny vocoder takes no seeds
    assert got == expected
    assert [o.numel() for o in outputs] == [8 * (end - start) for _, start, end, _ in got]
    # Enough left context for the causal vocoder: the chunks add up to the whole decode.
    (whole,) = core.model.generate([GenerationItem(codes)])
    assert torch.equal(torch.cat(outputs), whole)
    assert core.counters()["stream_entries"] == 0 and not core.has_work()
    assert core.coordinator.num_entries == 0


def test_a_stream_shorter_than_the_right_context_flushes_at_the_end(tiny_omni):
    core, seen = stage(tiny_omni, left=2, right=8)
    codes = torch.arange(10, 16)
    outputs = feed(core, "short", [codes[:4], codes[4:], codes[:0]])
    assert len(seen) == 1 and torch.equal(seen[0].rows, codes)
    assert (seen[0].context_len, seen[0].lookahead_len, seen[0].offset) == (0, 0, 0)
    (whole,) = core.model.generate([GenerationItem(codes)])
    assert len(outputs) == 1 and torch.equal(outputs[0], whole)


def test_without_right_context_every_chunk_decodes_at_once(tiny_omni):
    core, seen = stage(tiny_omni, left=4, right=0)
    codes = torch.arange(10, 22)
    outputs = feed(core, "plain", [codes[:2], codes[2:8], codes[8:], codes[:0]])
    assert [(i.offset, i.context_len, i.lookahead_len, len(i.rows)) for i in seen] == [
        (0, 0, 0, 2),
        (0, 2, 0, 8),
        (4, 4, 0, 8),
        (8, 4, 0, 4),
    ]
    assert outputs[-1].numel() == 0  # the empty last chunk only finishes the request
    (whole,) = core.model.generate([GenerationItem(codes)])
    assert torch.equal(torch.cat(outputs), whole)


def test_tiny_vocoder_audio_is_bit_identical_alone_and_among_others():
    """float32: an item's audio is the same whatever else is in the call (10 compositions)."""
    from omnistage.families.tiny_codec.vocoder import TinyCodeVocoder

    torch.manual_seed(0)
    config = {"hidden_size": 32, "kernel_size": 3, "num_layers": 2, "vocab_size": 64}
    model = TinyCodeVocoder(config | {"samples_per_code": 8, "sample_rate": 800}, torch.float32)
    with torch.no_grad():  # its layers do not initialize themselves (weights are loaded)
        for p in model.parameters():
            p.normal_(0, 0.3)
    items = [GenerationItem(torch.randint(0, 64, (6 + i % 3,))) for i in range(9)]
    alone = [model.generate([item])[0] for item in items]
    for trial in range(10):
        chosen = list(range(9))[trial % 9 :][: 2 + trial % 7]
        together = model.generate([items[i] for i in chosen])
        for i, audio in zip(chosen, together, strict=True):
            assert torch.equal(audio, alone[i]), (trial, i)
