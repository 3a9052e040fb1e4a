"""Qwen3-TTS Base: voices cloned from uploaded clips (x-vector mode) on the tiny checkpoint.

- 16 concurrent requests with 16 different uploaded voices each equal the same request
  alone (float64, bit for bit): a voice's speaker row never leaks into another request.
- The voice store keeps voices on disk (a new store over the same folder sees them),
  refuses bad clips naming the field, and a deleted voice is a 400-style ValueError.
"""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
import soundfile

from omnistage import SamplingParams
from omnistage.families.qwen3_tts.tiny import make_tiny_qwen3_tts
from omnistage.pipeline.omni import AsyncOmni, Omni
from omnistage.pipeline.voices import voice_store
from omnistage.testing.tiny_deploys import tiny_speech_deploy
from omnistage.voice_store import VoiceStore

PARAMS = {"talker": SamplingParams(temperature=0.9, top_k=50, seed=11, max_tokens=12)}


def clip(seed: int, seconds: float = 1.5) -> bytes:
    """A distinct, non-silent WAV clip per seed."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(24000 * seconds)) / 24000
    tone = np.sin(2 * np.pi * (100 + 40 * seed) * t) + 0.2 * rng.standard_normal(t.size)
    buffer = io.BytesIO()
    soundfile.write(buffer, 0.3 * tone / np.abs(tone).max(), 24000, format="WAV")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    ckpt = make_tiny_qwen3_tts(tmp_path_factory.mktemp("qwen3-tts-base") / "base", 0, "base")
    return tiny_speech_deploy("demo-qwen3-tts", ckpt)


@pytest.fixture(scope="module")
def voices(spec, tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        store = voice_store(spec)
        ids = [store.add(clip(i), f"transcript {i}", f"voice {i}")["id"] for i in range(16)]
        yield store, ids


def _all(spec, *groups: tuple[list[str], list[str]]) -> list[list[np.ndarray]]:
    """Each group's requests (texts, voice ids) at once, the groups one after another on
    one pipeline: the audio of each request, by group."""

    async def main():
        with AsyncOmni(spec, in_process=True) as omni:

            async def one(i, text, voice):
                async for out in omni.generate(text, PARAMS, request_id=f"c{i}", voice=voice):
                    if out.finished:
                        return out

            outs = []
            for g, (texts, ids) in enumerate(groups):
                pairs = enumerate(zip(texts, ids, strict=True))
                outs.append(await asyncio.gather(*(one(f"{g}-{i}", t, v) for i, (t, v) in pairs)))
            return outs

    runs = asyncio.run(main())
    for out in (out for group in runs for out in group):
        assert out.error is None, out.error
    return [[out.audio for out in group] for group in runs]


def test_sixteen_uploaded_voices_never_cross(spec, voices, monkeypatch):
    store, ids = voices
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(store.root.parents[1]))
    texts = [f"Sentence number {i}." for i in range(16)]
    # Same text, voices far apart (a hum, a buzz): different audio. (The tiny random
    # speaker encoder maps similar clips to nearly equal x-vectors.)
    t = np.arange(48000) / 24000
    hum, buzz = io.BytesIO(), io.BytesIO()
    soundfile.write(hum, 0.3 * np.sin(2 * np.pi * 220 * t), 24000, format="WAV")
    soundfile.write(buzz, 0.2 * np.sign(np.sin(2 * np.pi * 130 * t)), 24000, format="WAV")
    far = [store.add(hum.getvalue())["id"], store.add(buzz.getvalue())["id"]]
    alone = [([texts[i]], [ids[i]]) for i in (0, 7, 15)]
    together, *alones, same = _all(spec, (texts, ids), *alone, (["One text."] * 2, far))
    for i, (audio,) in zip((0, 7, 15), alones, strict=True):
        assert np.array_equal(together[i], audio), i
    assert not np.array_equal(same[0], same[1])
    for voice in far:
        store.delete(voice)


def test_store_persists_and_refuses_bad_clips(spec, voices, monkeypatch):
    store, ids = voices
    again = VoiceStore(store.root)
    assert [r["id"] for r in again.list()] == ids
    assert again.get(ids[3])["text"] == "transcript 3"
    silent = io.BytesIO()
    soundfile.write(silent, np.zeros(24000 * 2), 24000, format="WAV")
    bad = {"silent": silent.getvalue(), "too short": clip(1, 0.3), "garbage": b"not audio"}
    for why, data in bad.items():
        with pytest.raises(ValueError, match=r"^audio: "):
            store.add(data)
        assert len(store.list()) == 16, why
    extra = store.add(clip(99))["id"]
    assert store.delete(extra) and not store.delete(extra)
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(store.root.parents[1]))
    with Omni(spec, in_process=True) as omni, pytest.raises(ValueError, match="^voice: no upl"):
        omni.generate("Hi.", PARAMS, voice=extra)
