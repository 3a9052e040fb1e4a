"""Qwen3-TTS (talker -> code2wav, the packaged demo-qwen3-tts deploy) on tiny checkpoints.

- Parity: greedy, every case of `fixtures/qwen3_tts/talker_codes.json` (CustomVoice with
  named speakers, a dialect speaker, an instruction, streamed text; VoiceDesign; Base
  speaking in a voice cloned from an uploaded clip, x-vector mode) gives
  the official reference's waveform (qwen-tts 0.1.1, float32) within 1e-5: the talker's
  codes are the reference's, frame for frame (a differing code changes the waveform by
  far more), and code2wav decodes them as it does.
- Sync and async scheduling give bit-identical audio with a sampled, seeded talker.
- Voices never cross: requests with different voices, batched, each equal the same
  request alone (float64); streamed audio equals whole-payload audio.
- A stream ends exactly once; bad requests are ValueErrors naming the field, and the
  pipeline goes on serving.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from omnistage import SamplingParams
from omnistage.families.qwen3_tts.prompt import Qwen3TTSPrompter
from omnistage.families.qwen3_tts.reference_codes import ReferenceAudioEncoder
from omnistage.families.qwen3_tts.tiny import make_tiny_qwen3_tts
from omnistage.pipeline.omni import AsyncOmni, Omni
from omnistage.pipeline.voices import voice_store
from omnistage.testing.tiny_deploys import tiny_speech_deploy

FIXTURE = Path(__file__).parents[1] / "fixtures" / "qwen3_tts" / "talker_codes.json"
SAMPLED = SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05, seed=3)


@pytest.fixture(scope="module")
def reference():
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, reference):
    root = tmp_path_factory.mktemp("qwen3-tts")
    kinds = {case["kind"] for case in reference["cases"]}
    return {kind: make_tiny_qwen3_tts(root / kind, reference["seed"], kind) for kind in kinds}


def _stream_text(monkeypatch) -> None:
    """Requests built with the text streamed in (the reference's non_streaming_mode=False)."""
    build = Qwen3TTSPrompter.build

    def streamed(self, text, speaker, language_id, instructions=None, stream_text=False):
        return build(self, text, speaker, language_id, instructions, True)

    monkeypatch.setattr(Qwen3TTSPrompter, "build", streamed)


def _uploaded_reference_clip(spec, transcript: str | None) -> str:
    """The Base cases' voice: the fixture script's clip (with its transcript: in-context
    cloning; without: x-vector only), uploaded to the voice store."""
    script = FIXTURE.with_name("make_talker_fixture.py")
    loader = importlib.util.spec_from_file_location("make_talker_fixture", script)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    buffer = io.BytesIO()
    soundfile.write(buffer, module.reference_clip(), 24000, format="WAV", subtype="FLOAT")
    return voice_store(spec).add(buffer.getvalue(), transcript)["id"]


def test_greedy_audio_equals_the_reference(checkpoints, reference, monkeypatch, tmp_path):
    frames = reference["max_new_tokens"] - 1  # the reference completes one frame less
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path))
    for case in reference["cases"]:
        with monkeypatch.context() as patch:
            if not case["non_streaming_mode"] and case["kind"] != "base":
                _stream_text(patch)  # a Base checkpoint streams its text by default
            spec = tiny_speech_deploy("demo-qwen3-tts", checkpoints[case["kind"]], dtype="float32")
            if case["kind"] == "base":  # cloned from an uploaded clip
                case["speaker"] = _uploaded_reference_clip(spec, case["reference_text"])
            if case.get("reference_codes") is not None:
                # In context: the reference's own codes of the clip (its Mimi encoder and
                # ours, transformers 4.57 vs 5, differ in 1.3% of this clip's codes, from
                # frame 218 on; `test_qwen3_tts_speaker` holds them equal on short clips).
                codes = torch.tensor(case["reference_codes"])
                patch.setattr(ReferenceAudioEncoder, "encode", lambda self, audio, c=codes: c)
            params = {
                "talker": SamplingParams(
                    temperature=0.0, repetition_penalty=1.05, min_tokens=2, max_tokens=frames
                )
            }
            language = None if case["language"] == "auto" else case["language"]
            with Omni(spec, in_process=True) as omni:
                (out,) = omni.generate(
                    case["text"],
                    params,
                    voice=case["speaker"],
                    instructions=case["instructions"],
                    language=language,
                )
        assert out.error is None, out.error
        expected = np.asarray(case["waveform"], dtype=np.float32)
        assert out.sample_rate == case["sample_rate"]
        assert out.audio.shape == expected.shape, case["text"]
        np.testing.assert_allclose(out.audio, expected, rtol=0, atol=1e-5)


TEXTS = ["Hello there.", "A second, longer sentence to read.", "Three."]
VOICES = ["vivian", "ryan", "uncle_fu"]
SHORT_CONTEXT = {"max_model_len": 128, "block_size": 4}
KV_ARGS = {**SHORT_CONTEXT, "num_kv_blocks": 33}
"""Room for about one utterance of the tiny talker at a time."""


def test_sync_and_async_scheduling_give_identical_audio(checkpoints):
    ckpt = checkpoints["custom_voice"]
    sync = _concurrent(tiny_speech_deploy("demo-qwen3-tts", ckpt, async_scheduling=False))
    asyn = _concurrent(tiny_speech_deploy("demo-qwen3-tts", ckpt, async_scheduling=True))
    for a, b in zip(sync, asyn, strict=True):
        assert np.array_equal(a, b)


def _concurrent(spec, texts=None, voices=None, then=()) -> list[np.ndarray]:
    """Requests with different voices at once, through AsyncOmni (steps interleave): the
    audio of each, as its chunks arrived; then each (text, voice) of `then` alone, one
    after another on the same pipeline (their audio follows)."""
    texts = texts or TEXTS * 2
    voices = voices or VOICES + VOICES[::-1]

    async def main():
        with AsyncOmni(spec, in_process=True) as omni:

            async def one(i, text, voice):
                final, chunks = None, []
                async for out in omni.generate(
                    text, {"talker": SAMPLED}, request_id=f"r{i}", voice=voice
                ):
                    if out.new_data is not None:
                        chunks.append(out.new_data.float().numpy().reshape(-1))
                    if out.finished:
                        final = out
                return final, np.concatenate(chunks)

            together = await asyncio.gather(
                *(one(i, t, v) for i, (t, v) in enumerate(zip(texts, voices, strict=True)))
            )
            alone = [await one(len(texts) + k, t, v) for k, (t, v) in enumerate(then)]
            return [*together, *alone]

    outs = asyncio.run(main())
    for out, _ in outs:
        assert out.error is None, out.error
    return [audio for _, audio in outs]


def test_voices_never_cross_batched_equals_alone(checkpoints):
    spec = tiny_speech_deploy("demo-qwen3-tts", checkpoints["custom_voice"])
    texts, voices = TEXTS * 2, VOICES + VOICES[::-1]
    pairs = list(zip(texts, voices, strict=True))
    runs = _concurrent(spec, texts, voices, then=pairs)
    together, alones = runs[: len(pairs)], runs[len(pairs) :]
    for i, (text, voice) in enumerate(pairs):
        assert np.array_equal(together[i], alones[i]), (text, voice)
    # Different voices of one text give different audio.
    assert not np.array_equal(together[0], together[5])


def test_streamed_audio_equals_whole_payload_audio(checkpoints):
    ckpt = checkpoints["custom_voice"]
    streamed = _concurrent(tiny_speech_deploy("demo-qwen3-tts", ckpt, stream=True))
    whole = _concurrent(tiny_speech_deploy("demo-qwen3-tts", ckpt, stream=False))
    for s, w in zip(streamed, whole, strict=True):
        assert s.shape == w.shape
        np.testing.assert_allclose(s, w, rtol=0, atol=1e-5)


def test_a_stream_finishes_once_and_bad_requests_name_their_field(checkpoints):
    spec = tiny_speech_deploy("demo-qwen3-tts", checkpoints["custom_voice"])

    async def main():
        with AsyncOmni(spec, in_process=True) as omni:
            finished, audio = 0, []
            async for out in omni.generate("Stream me.", {"talker": SAMPLED}, voice="ryan"):
                finished += out.finished
                if out.new_data is not None:
                    audio.append(out.new_data.numpy())
            errors = {}
            bad = [
                ("voice", dict(voice="nobody")),
                ("language", dict(language="klingon")),
                ("instructions", dict(instructions=7)),
                ("input", dict(prompt="   ")),
                ("input", dict(prompt="word " * 1000)),  # 5000 tokens: over the limit
            ]
            for i, (field, kwargs) in enumerate(bad):
                prompt = kwargs.pop("prompt", "Fine text.")
                try:
                    async for out in omni.generate(prompt, {"talker": SAMPLED}, **kwargs):
                        if out.finished:
                            errors[(i, field)] = out.error
                except ValueError as e:
                    errors[(i, field)] = str(e)
            after = None
            async for out in omni.generate("Still serving.", {"talker": SAMPLED}):
                if out.finished:
                    after = out
            return finished, audio, errors, after

    finished, audio, errors, after = asyncio.run(main())
    assert finished == 1 and len(audio) > 1
    assert len(errors) == 5
    for (_, field), error in errors.items():
        # Refused up front (the frontend) or by the talker's prompter (the server answers
        # "stage talker: field: why" from the entry stage as a 400).
        assert error is not None and re.match(rf"(stage talker: )?{field}: ", error), error
    assert after.error is None and after.audio.size > 0


def test_a_talker_preempted_mid_utterance_speaks_the_same(checkpoints, monkeypatch):
    """A KV cache too small for every request at once preempts talkers mid-utterance; a
    recomputed talker is sent its codes so far again (`NewRequestData.output_codes`) and
    speaks exactly as with room to spare."""
    from omnistage.core.scheduler import Scheduler

    ckpt = checkpoints["custom_voice"]
    roomy = _concurrent(tiny_speech_deploy("demo-qwen3-tts", ckpt).with_engine_args(SHORT_CONTEXT))
    preempted, preempt = [], Scheduler._preempt

    def counting(self, request):
        if request.output_codes:
            preempted.append(request.request_id)
        return preempt(self, request)

    monkeypatch.setattr(Scheduler, "_preempt", counting)
    spec = tiny_speech_deploy("demo-qwen3-tts", ckpt).with_engine_args(KV_ARGS)
    crowded = _concurrent(spec)
    assert preempted, "the small KV cache preempted no talker mid-utterance"
    for a, b in zip(roomy, crowded, strict=True):
        assert np.array_equal(a, b)
