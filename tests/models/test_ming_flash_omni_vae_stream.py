"""Ming-flash-omni's audio VAE decoder over a stream's chunks (`audio_vae_stream.py`): each
latent frame decoded once, after the stream's kept state, and the chunks add up to the
whole decode however they are cut; two chunks of a stream in one call decode in order; a
failed call leaves the stream as it was (its Qwen2 cache is cut back on the next use)."""

from __future__ import annotations

import pytest
import torch

from omnistage.families.ming_flash_omni import audio_vae
from omnistage.families.ming_flash_omni.audio_vae import TINY_VAE, MingFlashAudioVAE
from omnistage.models.generation import GenerationItem
from tests.models.stream_items import (
    assert_a_failed_call_leaves_the_stream,
    assert_two_chunks_in_one_call_decode_in_order,
)
from tests.models.stream_items import stream_items as shared_stream_items

FRAMES_PER_ROW = 2
WIDTH = FRAMES_PER_ROW * TINY_VAE["latent_dim"]


@pytest.fixture(scope="module")
def vae() -> MingFlashAudioVAE:
    torch.manual_seed(0)
    model = MingFlashAudioVAE(TINY_VAE, torch.float64).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.3)  # far from the init's near-identity: every part matters
    return model


def rows(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, WIDTH, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def stream_items(latents: torch.Tensor, chunks: list[int], left_context: int = 0):
    """A stream's items as the generation stage makes them (one patch of right context)."""
    return shared_stream_items(latents, chunks, left_context=left_context, lookahead=1)


@pytest.mark.parametrize("chunks", [[1, 4, 4, 4, 4, 4, 4, 4, 1], [1] * 30, [29, 1], [7, 23]])
def test_stream_chunks_add_up_to_the_whole_decode(vae, chunks):
    latents = rows(30, seed=1)
    (whole,) = vae.generate([GenerationItem(latents)])
    pieces = [vae.generate([item])[0] for item in stream_items(latents, chunks)]
    per_row = whole.shape[0] // 30
    assert [p.shape[0] for p in pieces] == [c * per_row for c in chunks]
    # float32 out (as every audio stage's): equal up to its rounding
    torch.testing.assert_close(torch.cat(pieces), whole, rtol=0, atol=1e-7)
    # Left-context rows are not decoded again: other values there change nothing.
    items = stream_items(latents, chunks, left_context=3)
    for item in items[1:]:
        item.rows[: item.context_len] += 1.0
    again = [vae.generate([item])[0] for item in items]
    assert all(torch.equal(a, b) for a, b in zip(again, pieces, strict=True))


def test_two_chunks_of_a_stream_in_one_call_decode_in_order(vae):
    latents, other = rows(12, seed=2), rows(9, seed=3)
    assert_two_chunks_in_one_call_decode_in_order(
        vae, lambda: stream_items(latents, [2, 5, 5]), stream_items(other, [4, 5])
    )


def test_a_failed_call_leaves_the_stream_as_it_was(vae, monkeypatch):
    # The Qwen2's cache has grown when the second decode fails.
    latents = rows(15, seed=4)
    assert_a_failed_call_leaves_the_stream(
        vae, monkeypatch, audio_vae, "decode_chunk", lambda: stream_items(latents, [5, 5, 5])
    )
