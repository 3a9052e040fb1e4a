"""Qwen3-Omni's code2wav as a generation-stage model: parity with transformers, and
streamed chunks (with enough left context) that add up to the whole decode: no
samples lost at the seams, and values equal to 1e-5."""

from __future__ import annotations

import pytest
import torch

from omnistage.families.qwen3_omni.tiny import make_tiny_qwen3_omni
from omnistage.families.qwen3_omni.tiny_config import CODEBOOK_SIZE, NUM_CODE_GROUPS
from omnistage.models.generation import GenerationItem, load_generation_model


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_qwen3_omni(tmp_path_factory.mktemp("qwen3-omni-c2w"), dtype=torch.float64)


@pytest.fixture(scope="module")
def vocoder(ckpt):
    return load_generation_model(ckpt, torch.float64, part="code2wav")


def codes(frames: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CODEBOOK_SIZE, (frames, NUM_CODE_GROUPS), generator=g)


def test_whole_decode_matches_transformers(ckpt, vocoder):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    ref = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float64, experts_implementation="eager"
    )
    frames = codes(40)
    (ours,) = vocoder.generate([GenerationItem(frames)])
    with torch.no_grad():
        expected = ref.code2wav(frames.T.unsqueeze(0))[0, 0].float()
    assert ours.shape == expected.shape == (40 * vocoder.upsample - vocoder.trim,)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("chunks", [[2, 8, 8, 8, 8, 6], [1, 39], [13, 13, 14]])
def test_streamed_chunks_concatenate_to_the_whole_decode(vocoder, chunks):
    # What a frame hears fades with distance (attention window, then the convolutions):
    # on the tiny model 24 frames of context leave ~1e-3 at the seams, 32 frames ~4e-7.
    frames, left_context = codes(40, seed=1), 32
    (whole,) = vocoder.generate([GenerationItem(frames)])
    pieces, start = [], 0
    for size in chunks:
        context = min(start, left_context)
        item = GenerationItem(frames[start - context : start + size], context_len=context)
        (piece,) = vocoder.generate([item])
        pieces.append(piece)
        start += size
    streamed = torch.cat(pieces)
    assert streamed.shape == whole.shape
    torch.testing.assert_close(streamed, whole, rtol=0, atol=1e-5)


def test_short_left_context_leaves_seams(vocoder):
    """Less context than the receptive field: the chunks after the first differ a little
    (what the reference's 25-frame `chunked_decode` does with a 72-frame window)."""
    frames = codes(40, seed=2)
    (whole,) = vocoder.generate([GenerationItem(frames)])
    (first,) = vocoder.generate([GenerationItem(frames[:20])])
    (second,) = vocoder.generate([GenerationItem(frames[19:], context_len=1)])
    assert torch.equal(first, whole[: first.numel()])
    assert not torch.allclose(torch.cat([first, second]), whole, atol=1e-6)


def test_wrong_code_shape_is_named(vocoder):
    with pytest.raises(ValueError, match=r"codes.audio: expected \[frames, 4\] codes"):
        vocoder.generate([GenerationItem(torch.zeros(5, 3, dtype=torch.long))])


def test_right_context_rows_are_not_decoded(vocoder):
    """A causal decoder needs no look-ahead: rows after the chunk's own (right context, which
    the generation stage sends when the edge asks for it) change nothing."""
    frames = codes(30, seed=3)
    (plain,) = vocoder.generate([GenerationItem(frames[:24], context_len=8)])
    (ahead,) = vocoder.generate([GenerationItem(frames, context_len=8, lookahead_len=6)])
    assert torch.equal(plain, ahead)
