"""CosyVoice3's token2wav runs the flow once per call for all its items (right-padded,
per-row attention masks: `families/cosyvoice3/flow_batch.py`); each item's audio must be
the audio of that item alone.

- Exactly equal, in float64 and float32, for items of different lengths and voices,
  whole, mid-stream (chunk attention, look-ahead, derived token offset), a stream's last
  chunk (streamed head + full-attention tail) and a chunk too short to speak, all in one
  call, padded into one group or grouped by length. (Attention runs per row: masking
  padded keys in one batched SDPA call moved float32 results by ~1e-6.)
- A stream whose chunks each share a call with other requests gives exactly the audio
  of its chunks run alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnistage.families.cosyvoice3 import flow
from omnistage.families.cosyvoice3.dit import RowMasks, chunk_mask
from omnistage.families.cosyvoice3.flow_batch import attention_mask, length_groups
from omnistage.families.cosyvoice3.tiny import make_tiny_cosyvoice3
from omnistage.models.generation import GenerationItem, load_generation_model
from omnistage.models.loader import resolve_model


@pytest.fixture(scope="module")
def view(tmp_path_factory) -> Path:
    checkpoint = make_tiny_cosyvoice3(tmp_path_factory.mktemp("cv3") / "tiny")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        return resolve_model(str(checkpoint)).path


def _tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 6561, (n,), generator=torch.Generator().manual_seed(seed))


def _mixed() -> list[GenerationItem]:
    # the tiny voices have 50 prompt tokens and the flow 25-token chunks
    return [
        GenerationItem(_tokens(40, 1), speaker="demo"),
        GenerationItem(_tokens(71, 2), speaker="bright"),
        GenerationItem(_tokens(60, 3), context_len=30, speaker="demo", last=False),
        GenerationItem(_tokens(90, 4), context_len=55, speaker="bright"),
        GenerationItem(_tokens(20, 5), speaker="bright", last=False),  # nothing to speak yet
        GenerationItem(_tokens(33, 6), speaker="demo", last=False),
        GenerationItem(_tokens(7, 7), speaker="demo"),
    ]


_ALONE: dict[tuple[torch.dtype, str], list[torch.Tensor]] = {}
"""Outputs of items run alone, by dtype and workload: one item is one group whatever the
grouping, so both `slack` parameters share them (each is minutes of a 2-core CI)."""


def _alone(model, items: list[GenerationItem], dtype: torch.dtype) -> list[torch.Tensor]:
    if (dtype, "mixed") not in _ALONE:
        _ALONE[dtype, "mixed"] = [model.generate([item])[0] for item in items]
    return _ALONE[dtype, "mixed"]


@pytest.fixture(params=["one group", "groups of similar lengths"])
def slack(request, monkeypatch) -> None:
    """Every request padded into one group (the strongest test of the masks), or the
    default grouping."""
    if request.param == "one group":
        monkeypatch.setattr(flow, "PADDING_SLACK", 1e9)


def test_float64_batched_items_equal_each_item_alone(view, slack):
    model = load_generation_model(view, torch.float64, part="token2wav")
    items = _mixed()
    batched = model.generate(items)
    for i, (together, alone) in enumerate(
        zip(batched, _alone(model, items, torch.float64), strict=True)
    ):
        assert together.shape == alone.shape, i
        assert torch.equal(together, alone), (i, (together - alone).abs().max())
    assert batched[4].numel() == 0 and all(b.numel() for i, b in enumerate(batched) if i != 4)
    # the order of the items in the call does not matter either
    for together, alone in zip(model.generate(items[::-1]), batched[::-1], strict=True):
        assert torch.equal(together, alone)


def test_float32_batched_items_equal_each_item_alone(view, slack):
    """Exact in float32 too (`omnistage verify` compares digests in the deploy's dtype)."""
    model = load_generation_model(view, torch.float32, part="token2wav")
    items = _mixed()
    for together, alone in zip(
        model.generate(items), _alone(model, items, torch.float32), strict=True
    ):
        assert together.shape == alone.shape
        assert torch.equal(together, alone), (together - alone).abs().max()


def _stream(model, tokens: torch.Tensor, cuts: list[int], others: bool) -> torch.Tensor:
    """The stream of `tokens` chunked at `cuts`; each chunk's call also runs two other
    requests (a whole one and another stream's chunk) when `others`."""
    audio = []
    bounds = [0, *cuts, len(tokens)]
    for k in range(len(bounds) - 1):
        item = GenerationItem(
            tokens[: bounds[k + 1]],
            context_len=bounds[k],
            speaker="bright",
            last=k == len(bounds) - 2,
        )
        extra = [
            GenerationItem(_tokens(30 + 9 * k, 10 + k), speaker="demo"),
            GenerationItem(_tokens(80, 20), context_len=28, speaker="demo", last=False),
        ]
        out = model.generate([*extra[:1], item, *extra[1:]] if others else [item])
        audio.append(out[1] if others else out[0])
    return torch.cat(audio)


def test_a_stream_batched_with_other_requests_equals_it_alone(view, slack):
    model = load_generation_model(view, torch.float64, part="token2wav")
    tokens = _tokens(110, 30)
    batched = _stream(model, tokens, [28, 53, 78], others=True)
    if (torch.float64, "stream") not in _ALONE:
        _ALONE[torch.float64, "stream"] = [_stream(model, tokens, [28, 53, 78], others=False)]
    (alone,) = _ALONE[torch.float64, "stream"]
    assert batched.shape == alone.shape and batched.numel() > 0
    assert torch.equal(batched, alone)


def test_the_mask_of_a_uniform_batch_is_the_mask_of_one_item():
    cpu = torch.device("cpu")
    assert attention_mask([12, 12], [False, False], 4, cpu) is None
    assert torch.equal(attention_mask([12], [True], 4, cpu), chunk_mask(12, 4, cpu))
    assert attention_mask([12], [True], 0, cpu) is None


def test_rows_of_a_mixed_batch_attend_among_their_own_frames_as_alone():
    cpu = torch.device("cpu")
    rows = attention_mask([6, 10, 3], [True, False, True], 4, cpu)
    assert isinstance(rows, RowMasks) and rows.lengths == (6, 10, 3)
    assert torch.equal(rows.masks[0], chunk_mask(6, 4, cpu)) and rows.masks[1] is None
    assert rows.repeated(2).lengths == (6, 10, 3, 6, 10, 3)


def test_length_groups_bound_the_padding():
    assert length_groups([100, 300, 105, 111, 310, 100], 0.1) == [[0, 5, 2], [3], [1, 4]]
    assert length_groups([7, 9, 8], 1e9) == [[0, 2, 1]]
    assert length_groups([], 0.1) == []
