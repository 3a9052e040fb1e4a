"""CosyVoice3 speaking in an uploaded voice (demo-cosyvoice3's deploy, tiny checkpoint).

- Parity: the fixed clip of `fixtures/cosyvoice3/clone.pt` uploaded with its transcript,
  greedy, whole and streamed, gives the reference's `CosyVoice3.inference_zero_shot`
  audio with the same clip and transcript (`make_clone_fixture.py`) within 1e-5
  (float32): same length, so the LM wrote the reference's tokens, and the flow spoke
  with the clip's tokens, mel and x-vector as computed by our front end.
- Sync and async scheduling give bit-identical audio in uploaded voices, and requests in
  different uploaded voices batched each equal the same request alone.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from omnistage import SamplingParams
from omnistage.families.cosyvoice3.tiny import make_tiny_cosyvoice3
from omnistage.pipeline.omni import AsyncOmni, Omni
from omnistage.testing.tiny_deploys import tiny_speech_deploy
from omnistage.voice_store import VoiceStore

FIXTURE = Path(__file__).parents[1] / "fixtures" / "cosyvoice3" / "clone.pt"
GREEDY = {"llm": SamplingParams(temperature=0.0)}
SAMPLED = {"llm": SamplingParams(temperature=1.0, top_k=25, top_p=0.8, seed=5)}


@pytest.fixture(scope="module")
def reference() -> dict:
    return torch.load(FIXTURE, weights_only=True)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("clone-cache")


@pytest.fixture(autouse=True)
def _cache(cache, monkeypatch):
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(cache))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_cosyvoice3(tmp_path_factory.mktemp("cosyvoice3") / "tiny")


def _upload(checkpoint: Path, clip: np.ndarray, text: str | None) -> str:
    from omnistage.models.loader import resolve_model

    buffer = io.BytesIO()
    soundfile.write(buffer, clip, 24000, format="WAV", subtype="FLOAT")
    store = VoiceStore.for_model(resolve_model(str(checkpoint)).path)
    return store.add(buffer.getvalue(), text)["id"]


def test_cloned_voice_equals_the_reference_zero_shot(checkpoint, reference) -> None:
    voice = _upload(checkpoint, reference["clip24"].numpy(), "A hum.")
    for stream in (False, True):
        spec = tiny_speech_deploy("demo-cosyvoice3", checkpoint, dtype="float32", stream=stream)
        with Omni(spec, in_process=True) as omni:
            (out,) = omni.generate("Hi", GREEDY, voice=voice)
        expected = reference[f"zero_shot/{'stream' if stream else 'whole'}"]
        assert out.error is None, out.error
        assert out.audio.shape == tuple(expected["audio"].shape), stream
        assert out.audio.size == expected["tokens"].numel() * 2 * 480
        np.testing.assert_allclose(out.audio, expected["audio"].numpy(), rtol=0, atol=1e-5)


def _run(spec, voices: list[str], alone: bool = False) -> list[np.ndarray]:
    """Each voice's audio for "Hi": requests at once, or (alone) one after another."""

    async def main():
        with AsyncOmni(spec, in_process=True) as omni:

            async def one(i, voice):
                chunks = []
                async for out in omni.generate("Hi", SAMPLED, request_id=f"r{i}", voice=voice):
                    assert out.error is None, out.error
                    if out.new_data is not None:
                        chunks.append(out.new_data.double().numpy().reshape(-1))
                return np.concatenate(chunks)

            together = await asyncio.gather(*(one(i, v) for i, v in enumerate(voices)))
            if not alone:
                return together, None
            return together, [await one(len(voices) + i, v) for i, v in enumerate(voices)]

    return asyncio.run(main())


def test_uploaded_voices_sync_equals_async_and_never_cross(checkpoint, reference) -> None:
    clip = reference["clip24"].numpy()
    voices = [
        _upload(checkpoint, clip, "A hum."),
        _upload(checkpoint, np.roll(clip, 4000) * 0.5, None),
    ]
    asyn = tiny_speech_deploy("demo-cosyvoice3", checkpoint, async_scheduling=True)
    sync = tiny_speech_deploy("demo-cosyvoice3", checkpoint, async_scheduling=False)
    together, alone = _run(asyn, voices, alone=True)
    for a, b, c in zip(together, _run(sync, voices)[0], alone, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    n = min(together[0].size, together[1].size)
    assert not np.allclose(together[0][:n], together[1][:n])
