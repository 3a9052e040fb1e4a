"""Ming-flash-omni-2.0's talker alone (talker -> audio VAE, the packaged
demo-ming-flash-omni-tts deploy: the talker renders its own prompt from the text).

- Parity (float32): for the reference fixture's two cases (`talker_reference.npz`, made
  with inclusionAI/Ming-omni-tts's `prepare_input_embed(prompt, text)` and `sample`, no
  speaker embedding: the reference's text-only entry), the prompter's ids are the
  reference's prompt ids, the talker stops at the reference's step and the audio is the
  reference decoder's waveform of the reference's patches.
- Float64: sync and async scheduling give the same stop ids and audio bytes (seeded flow
  head at temperature 1) and the audio VAE receives byte-identical stream chunks, with
  `meta.finished` in exactly one (the last) of each request's; each request alone gives
  what it gives in a batch (stop ids exactly, audio to float64 rounding: a batch runs
  other GEMM shapes).
- The stream edge (each chunk decoded with every earlier patch and one patch after it)
  gives the audio of the whole-payload edge, bit for bit in float64 (measured: the decoder
  is causal and the look-ahead is inside the next patch; with no right context the last
  samples of a chunk differ by 0.5). A streaming client sees one
  finished output per request, its audio the whole run's, in several pieces (the stream
  edge's chunks carry `meta.finished` only in the last: the first ones leave before the
  talker finishes).
- A voice, `instructions`, another `language` and an empty text are ValueErrors naming the
  field; nothing is left held.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.core.payload import unpack_payload
from omnistage.families.ming_flash_omni.speech_prompt import MingFlashSpeechPrompter
from omnistage.families.ming_flash_omni.tiny import make_tiny_ming_flash_omni
from omnistage.pipeline.omni import AsyncOmni, Omni
from omnistage.testing.payload_equality import assert_same_payload
from omnistage.testing.tiny_deploys import tiny_speech_deploy
from tests.pipeline.pipeline_runs import run_recorded

FIXTURE = Path(__file__).parents[1] / "fixtures" / "ming_flash_omni" / "talker_reference.npz"
TEXTS = ["Hello there", "Why?", "Say a long sentence about cats, please."]
PARAMS = {"talker": SamplingParams(temperature=1.0, seed=7, max_tokens=16)}
DEPLOY = "demo-ming-flash-omni-tts"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("mf-tts")
    return make_tiny_ming_flash_omni(path, seed=0, dtype=torch.float64)


def _deploy(ckpt, async_scheduling: bool, dtype: str = "float64"):
    return tiny_speech_deploy(DEPLOY, ckpt, dtype=dtype, async_scheduling=async_scheduling)


def _run(spec, texts: list[str], params=PARAMS) -> tuple[list, dict]:
    """(per text: talker ids, audio), and what the audio VAE received, packed."""
    outputs, received = run_recorded(spec, texts, params)
    return [(o.outputs["talker"].token_ids, np.asarray(o.audio)) for o in outputs], received


@pytest.fixture(scope="module")
def sync_run(ckpt):
    return _run(_deploy(ckpt, False), TEXTS)


def test_text_only_prompt_stop_step_and_audio_match_the_reference(tmp_path):
    fixture = np.load(FIXTURE)
    meta = json.loads(str(fixture["meta"]))
    ckpt32 = make_tiny_ming_flash_omni(tmp_path, seed=0)
    prompter = MingFlashSpeechPrompter.from_checkpoint(ckpt32)
    spec = _deploy(ckpt32, False, "float32")
    for name, (text, seed, temperature) in meta["cases"].items():
        msg = SimpleNamespace(prompt=text, voice=None, instructions=None, language=None)
        inputs, budget = prompter.request_input("talker", msg)
        assert budget is None
        assert inputs.prompt_token_ids == fixture[f"{name}_prompt_ids"].tolist()
        params = {"talker": SamplingParams(temperature=temperature, seed=seed, max_tokens=16)}
        ((stops, audio),), _ = _run(spec, [text], params)
        steps = fixture[f"{name}_patches"].shape[0] // 4  # the tiny talker's patch_size
        assert stops == [0] * (steps - 1) + [1]
        np.testing.assert_allclose(audio, fixture[f"{name}_wav"], rtol=0, atol=1e-5)


def test_sync_equals_async_and_payloads_are_identical(ckpt, sync_run):
    ids, received = sync_run
    assert all(0 < len(stops) <= 16 and audio.size > 0 for stops, audio in ids)
    assert len({a.tobytes() for _, a in ids}) == len(TEXTS)  # the text matters
    async_ids, async_received = _run(_deploy(ckpt, True), TEXTS)
    for (stops, audio), (async_stops, async_audio) in zip(ids, async_ids, strict=True):
        assert stops == async_stops and audio.tobytes() == async_audio.tobytes()
    assert received.keys() == async_received.keys() and len(received) > len(TEXTS)
    for key, data in received.items():
        assert_same_payload(async_received[key], data, key)
    for i in range(len(TEXTS)):
        chunks = sorted(k for k in received if k[0] == i)
        finished = [bool(unpack_payload(received[k]).get("meta.finished")) for k in chunks]
        assert finished == [False] * (len(chunks) - 1) + [True], finished


def test_streamed_edge_equals_whole_payload_edge(ckpt, sync_run):
    whole_spec = tiny_speech_deploy(DEPLOY, ckpt, async_scheduling=False, stream=False)
    whole, received = _run(whole_spec, TEXTS)
    assert len(received) == len(TEXTS)  # one payload per request
    for (stops, audio), (whole_stops, whole_audio) in zip(sync_run[0], whole, strict=True):
        assert stops == whole_stops and audio.shape == whole_audio.shape
        np.testing.assert_array_equal(audio, whole_audio)


def test_alone_equals_batched(ckpt, sync_run):
    ids, _ = sync_run
    ((stops, audio),), _ = _run(_deploy(ckpt, False), [TEXTS[2]])
    assert stops == ids[2][0]
    np.testing.assert_allclose(audio, ids[2][1], rtol=0, atol=1e-9)


def test_streamed_audio_is_the_whole_audio(ckpt, sync_run):
    async def stream() -> list[tuple[int, bytes]]:
        with AsyncOmni(_deploy(ckpt, False), in_process=True) as omni:

            async def one(i: int) -> tuple[int, bytes]:
                finished, audio = 0, []
                async for out in omni.generate(TEXTS[i], PARAMS, request_id=f"s{i}"):
                    assert out.error is None, out.error
                    finished += out.finished
                    if out.stage == "audio_vae" and out.new_data is not None:
                        audio.append(out.new_data.numpy().tobytes())
                pieces.append(len(audio))
                return finished, b"".join(audio)

            return await asyncio.gather(*(one(i) for i in range(len(TEXTS))))

    pieces: list[int] = []
    assert asyncio.run(stream()) == [(1, audio.tobytes()) for _, audio in sync_run[0]]
    assert max(pieces) > 1  # the audio came in pieces, not at the talker's end


def test_bad_input_is_a_value_error_naming_the_field(ckpt):
    with Omni(_deploy(ckpt, False), in_process=True) as omni:
        with pytest.raises(ValueError, match="voice"):
            omni.generate(TEXTS[:1], PARAMS, voice="luna")
        for field, value in {"instructions": "whisper", "language": "French"}.items():
            (out,) = omni.generate(TEXTS[:1], PARAMS, **{field: value})
            assert out.error is not None and field in out.error
        (out,) = omni.generate(["   "], PARAMS)
        assert out.error is not None and "input" in out.error
        (ok,) = omni.generate(TEXTS[:1], PARAMS)
        counters = omni.stage_counters()
    assert ok.error is None
    assert all(v == 0 for c in counters.values() for v in c.values()), counters


def test_the_prompter_is_the_tts_talkers_alone():
    """The omni deploy's talker takes the prompt its edge builds; only the `-tts` deploys'
    part renders its own."""
    from omnistage.families.ming_flash_omni import MODEL_TYPE
    from omnistage.models import registry

    assert registry.stage_prompter_class(MODEL_TYPE, "talker") is None
    assert registry.stage_prompter_class(MODEL_TYPE, "tts_talker") is MingFlashSpeechPrompter
    assert registry.stage_prompter_class(MODEL_TYPE, "thinker") is None
