"""CosyVoice3 (LM -> token2wav, the packaged demo-cosyvoice3 deploy) on its tiny checkpoint.

- Parity: greedy, a zero-shot voice and an instruction, whole and streamed, give the
  reference's audio (FunAudioLLM/CosyVoice, `CosyVoice3Model.tts`, float32;
  `fixtures/cosyvoice3/pipeline.pt`) within 1e-5 (2.5e-6 measured): the LM's tokens are
  the reference's and the streamed chunks pick up where the previous ones stopped (the
  `token_offset` that seeds 001/003 found hard-coded to 0).
- Streamed audio does not depend on how the edge chunks the tokens (float64).
- Sync and async scheduling give bit-identical audio with a sampled, seeded LM; requests
  with different voices batched each equal the same request alone.
- A stream ends exactly once; bad requests are ValueErrors naming the field, and the
  pipeline goes on serving.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.families.cosyvoice3.tiny import make_tiny_cosyvoice3
from omnistage.families.cosyvoice3.token2wav import cut_silence
from omnistage.pipeline.omni import AsyncOmni, Omni
from omnistage.testing.tiny_deploys import tiny_speech_deploy

FIXTURE = Path(__file__).parents[1] / "fixtures" / "cosyvoice3" / "pipeline.pt"
INSTRUCTIONS = {
    "zero_shot": None,
    "instruct": "You are a helpful assistant. Speak slowly.<|endofprompt|>",
}
GREEDY = {"llm": SamplingParams(temperature=0.0)}
SAMPLED = {"llm": SamplingParams(temperature=1.0, top_k=25, top_p=0.8, seed=5)}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_cosyvoice3(tmp_path_factory.mktemp("cosyvoice3") / "tiny")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def test_greedy_audio_equals_the_reference_whole_and_streamed(checkpoint):
    reference = torch.load(FIXTURE, weights_only=True)
    for stream in (False, True):
        spec = tiny_speech_deploy("demo-cosyvoice3", checkpoint, dtype="float32", stream=stream)
        with Omni(spec, in_process=True) as omni:
            for case, instructions in INSTRUCTIONS.items():
                (out,) = omni.generate("Hi", GREEDY, voice="demo", instructions=instructions)
                expected = reference[f"{case}/{'stream' if stream else 'whole'}"]["audio"]
                assert out.error is None, out.error
                assert out.sample_rate == 24000
                assert out.audio.shape == tuple(expected.shape), (case, stream)
                np.testing.assert_allclose(out.audio, expected.numpy(), rtol=0, atol=1e-5)


def _stream(spec, texts, voices, params=SAMPLED, then=()) -> list[tuple[np.ndarray, int]]:
    """Requests at once through AsyncOmni: each one's audio as its chunks arrived, and how
    many outputs said finished; then each (text, voice) of `then` alone, one after another
    on the same pipeline (their results follow)."""

    async def main():
        with AsyncOmni(spec, in_process=True) as omni:

            async def one(i, text, voice):
                chunks, finished = [], 0
                async for out in omni.generate(text, params, request_id=f"r{i}", voice=voice):
                    finished += out.finished
                    assert out.error is None, out.error
                    if out.new_data is not None:
                        chunks.append(out.new_data.double().numpy().reshape(-1))
                return np.concatenate(chunks), finished

            together = await asyncio.gather(
                *(one(i, t, v) for i, (t, v) in enumerate(zip(texts, voices, strict=True)))
            )
            alone = [await one(len(texts) + k, t, v) for k, (t, v) in enumerate(then)]
            return [*together, *alone]

    return asyncio.run(main())


TEXTS = ["Hi", "Hello there.", "Yes"]
VOICES = ["demo", "bright", "bright"]


def test_streamed_audio_does_not_depend_on_the_chunking(checkpoint):
    """Each call speaks up to the flow's last chunk boundary that has its look-ahead, so with
    chunks of any fixed size the audio is the same. The packaged deploy's growing chunks
    (the reference's 25, 50, 100 hop) leave more tokens to the last call, which runs the flow
    without the chunk mask (the reference's `finalize`): that stretch differs slightly."""
    spec = tiny_speech_deploy("demo-cosyvoice3", checkpoint)
    (edge,) = spec.edges
    assert (edge.chunk_size, edge.chunk_growth, edge.max_chunk_size) == (50, 2, 100)

    def chunked(first: int, size: int) -> Any:
        fixed = dataclasses.replace(edge, first_chunk_size=first, chunk_size=size, chunk_growth=1)
        return dataclasses.replace(spec, edges=(fixed,))

    fixed = _stream(chunked(28, 25), TEXTS, VOICES)
    for (a, _), (b, _), (grown, _) in zip(
        fixed, _stream(chunked(3, 7), TEXTS, VOICES), _stream(spec, TEXTS, VOICES), strict=True
    ):
        assert a.shape == b.shape == grown.shape
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)
        np.testing.assert_allclose(grown, a, rtol=0, atol=1e-6)


def test_sync_and_async_give_identical_audio_and_voices_never_cross(checkpoint):
    asyn = tiny_speech_deploy("demo-cosyvoice3", checkpoint, async_scheduling=True)
    sync = tiny_speech_deploy("demo-cosyvoice3", checkpoint, async_scheduling=False)
    pairs = list(zip(TEXTS, VOICES, strict=True))
    runs = _stream(asyn, TEXTS, VOICES, then=[*pairs, ("Hi", "bright")])
    together, alones, (other_voice, _) = runs[:3], runs[3:6], runs[6]
    for (a, finished), (b, _) in zip(together, _stream(sync, TEXTS, VOICES), strict=True):
        assert finished == 1
        assert np.array_equal(a, b)
    for i, (text, voice) in enumerate(pairs):
        alone, finished = alones[i]
        assert finished == 1 and np.array_equal(together[i][0], alone), (text, voice)
    assert other_voice.shape != together[0][0].shape or not np.allclose(other_voice, together[0][0])


def test_bad_requests_name_their_field_and_the_pipeline_goes_on(checkpoint):
    spec = tiny_speech_deploy("demo-cosyvoice3", checkpoint)

    async def main():
        with AsyncOmni(spec, in_process=True) as omni:
            errors = {}
            bad = [
                ("voice", dict(voice="nobody")),
                ("input", dict(prompt="   ")),
                ("input", dict(prompt="word " * 300)),  # 1500 tokens: over the limit
                ("instructions", dict(instructions="slowly " * 300)),
            ]
            for i, (field, kwargs) in enumerate(bad):
                prompt = kwargs.pop("prompt", "Fine.")
                try:
                    async for out in omni.generate(prompt, SAMPLED, **kwargs):
                        if out.finished:
                            errors[(i, field)] = out.error
                except ValueError as e:
                    errors[(i, field)] = str(e)
            after = None
            async for out in omni.generate("Still serving.", SAMPLED, voice="demo"):
                if out.finished:
                    after = out
            return errors, after

    errors, after = asyncio.run(main())
    assert len(errors) == 4
    for (_, field), error in errors.items():
        assert error is not None and re.match(rf"(stage llm: )?{field}: ", error), error
    assert after.error is None and after.audio.size > 0


def test_runs_of_silence_are_cut_as_the_reference_cuts_them():
    silent = frozenset({1, 2})
    assert cut_silence([5, 1, 1, 2, 1, 7, 1], silent, 2) == [5, 1, 1, 7, 1]
    tokens = [1, 2, 1, 9, 2, 2, 2, 2, 3]
    for n in range(len(tokens) + 1):  # causal: a prefix's cut is a prefix of the cut
        whole = cut_silence(tokens, silent, 2)
        assert whole[: len(cut_silence(tokens[:n], silent, 2))] == cut_silence(
            tokens[:n], silent, 2
        )
