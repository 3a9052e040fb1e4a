"""MiMo-Audio (fused LM -> code2wav, the packaged demo-mimo-audio deploy) on the tiny
checkpoint.

- Parity: greedy, each prompt of `fixtures/mimo_audio/reference.json` (made by the
  official MiMo-Audio code on the same tiny weights, `make_reference_fixture.py`) gives
  the reference's text tokens and every position's 4x8 codes exactly, and its waveform
  within 1e-5 (float32; measured identical on the machine that made the fixture).
- Sync and async scheduling give identical text tokens, payload bytes and audio bytes
  (float64, sampled and seeded); each request of a batch equals it alone.
- Streamed audio (chunks of whole decode segments) equals the whole payload's bit for bit,
  and each stream ends with exactly one `meta.finished` payload, its last.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.core.payload import pack_payload, unpack_payload
from omnistage.families.mimo_audio.code2wav import MiMoAudioCode2Wav
from omnistage.families.mimo_audio.tiny import EMPTY_ID, make_tiny_mimo_audio
from omnistage.models.loader import resolve_model
from omnistage.pipeline.omni import Omni
from omnistage.testing.tiny_deploys import tiny_speech_deploy

FIXTURE = Path(__file__).parents[1] / "fixtures" / "mimo_audio" / "reference.json"
SAMPLED = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=16)
PROMPTS = [
    {"messages": [{"role": "user", "content": "Hello there."}]},
    {"messages": [{"role": "user", "content": "A second, longer sentence."}]},
    {"messages": [{"role": "user", "content": "Three."}]},
]


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, reference) -> Path:
    return make_tiny_mimo_audio(tmp_path_factory.mktemp("mimo") / "tiny", reference["seed"])


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    """The view of the published-layout checkpoint (`layout.py`) lands in a test cache."""
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def run(spec, prompts, params) -> tuple[list[Any], dict[tuple[int, int], dict]]:
    """Generate; the outputs and every payload code2wav received, by (prompt, chunk)."""
    got: dict[str, bytes] = {}
    with Omni(spec, in_process=True) as omni:
        for client in omni.orchestrator.clients.values():
            for connector in client.core.connectors.values():
                get = connector.get

                def recording(handle, timeout=None, get=get):
                    payload = get(handle, timeout)
                    kept = {k: v for k, v in payload.items() if k != "meta.request_id"}
                    got[handle.key] = pack_payload(kept)
                    return payload

                connector.get = recording
        outputs = omni.generate(prompts, {"lm": params})
    assert [o.error for o in outputs] == [None] * len(prompts)
    index = {o.request_id: i for i, o in enumerate(outputs)}
    received = {}
    for key, data in got.items():
        rid, _, chunk = key.rsplit("/", 2)
        received[index[rid], int(chunk)] = data
    return outputs, received


def test_greedy_codes_and_audio_equal_the_reference(checkpoint, reference):
    spec = tiny_speech_deploy("demo-mimo-audio", checkpoint, dtype="float32")
    cases = reference["cases"]
    greedy = SamplingParams(temperature=0.0, max_tokens=reference["max_new_tokens"])
    prompts = [{"prompt_token_ids": c["prompt_token_ids"]} for c in cases]
    outputs, received = run(spec, prompts, greedy)
    for i, (case, out) in enumerate(zip(cases, outputs, strict=True)):
        assert out.token_ids == case["tokens"]
        rows = unpack_payload(received[i, 0])["codes.output"]
        assert rows[:, 0].tolist() == case["tokens"]
        assert rows[:, 1:].reshape(-1, 4, 8).tolist() == case["codes"]
        assert EMPTY_ID in case["tokens"] and set(case["tokens"]) != {EMPTY_ID}
        assert out.audio.shape == (len(case["audio"]),)
        np.testing.assert_allclose(out.audio, np.array(case["audio"]), rtol=0, atol=1e-5)


def test_the_chat_template_renders_the_reference_prompt(checkpoint, reference):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    for case in reference["cases"]:
        messages = [{"role": "user", "content": case["prompt"]}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        assert list(ids) == case["prompt_token_ids"]


@pytest.fixture(scope="module")
def batched(checkpoint):
    """The prompts at once, async scheduling (float64, sampled)."""
    return run(tiny_speech_deploy("demo-mimo-audio", checkpoint), PROMPTS, SAMPLED)


def test_sync_and_async_scheduling_are_identical(checkpoint, batched):
    sync = run(
        tiny_speech_deploy("demo-mimo-audio", checkpoint, async_scheduling=False), PROMPTS, SAMPLED
    )
    for a, b in zip(sync[0], batched[0], strict=True):
        assert a.token_ids == b.token_ids
        assert a.audio.tobytes() == b.audio.tobytes() and a.audio.size > 0
    assert sync[1] == batched[1]


def test_batched_equals_alone(checkpoint, batched):
    together, _ = batched
    (alone,), _ = run(tiny_speech_deploy("demo-mimo-audio", checkpoint), PROMPTS[1:2], SAMPLED)
    assert alone.token_ids == together[1].token_ids
    assert alone.audio.tobytes() == together[1].audio.tobytes()
    assert together[0].audio.tobytes() != together[1].audio.tobytes()


def _chunked(spec, steps: int):
    edges = tuple(
        dataclasses.replace(e, first_chunk_size=steps, chunk_size=steps) for e in spec.edges
    )
    return dataclasses.replace(spec, edges=edges)


def test_streamed_audio_equals_whole_and_finishes_once(checkpoint, monkeypatch):
    monkeypatch.setattr(MiMoAudioCode2Wav, "segment_steps", 4)
    stream = _chunked(tiny_speech_deploy("demo-mimo-audio", checkpoint, stream=True), 4)
    whole = tiny_speech_deploy("demo-mimo-audio", checkpoint, stream=False)
    streamed, chunks = run(stream, PROMPTS, SAMPLED)
    once, _ = run(whole, PROMPTS, SAMPLED)
    for i, (s, w) in enumerate(zip(streamed, once, strict=True)):
        assert s.audio.size > 0 and s.audio.tobytes() == w.audio.tobytes()
        mine = sorted(k[1] for k in chunks if k[0] == i)
        assert len(mine) == SAMPLED.max_tokens // 4 + 1  # full chunks, then the (empty) last
        finished = [unpack_payload(chunks[i, c])["meta.finished"] for c in mine]
        assert finished == [False] * (len(mine) - 1) + [True]


def test_a_chunk_that_is_not_whole_segments_is_refused(checkpoint):
    from omnistage.models import registry
    from omnistage.models.generation import GenerationItem

    view = resolve_model(str(checkpoint)).path  # the published layout's view
    model = MiMoAudioCode2Wav.from_checkpoint(view, registry.auto_config(view), torch.float64)
    rows = torch.tensor([[EMPTY_ID, *[1] * 32]] * 5)
    model.check_item(GenerationItem(rows, offset=375, last=True))  # a last chunk: any length
    model.check_item(GenerationItem(torch.cat([rows] * 75), offset=0, last=False))
    with pytest.raises(ValueError, match=r"steps 0..5 is not made of whole 375-step segments"):
        model.check_item(GenerationItem(rows, offset=0, last=False))
    with pytest.raises(ValueError, match=r"steps 5..10"):
        model.check_item(GenerationItem(rows, offset=5, last=True))
    assert model.generate([GenerationItem(rows)])[0].shape == (5 * 4 * 16,)


def test_the_lm_speaks_only_at_empty_positions(batched):
    outputs, received = batched
    for i, out in enumerate(outputs):
        # Shorter than a chunk: one payload, the last, marked finished.
        assert [k for k in received if k[0] == i] == [(i, 0)]
        payload = unpack_payload(received[i, 0])
        assert payload["meta.finished"] is True
        rows = payload["codes.output"]
        speaking = rows[:, 0] == EMPTY_ID
        empty = torch.tensor([16, 16, 8, 8, 8, 8, 8, 8] * 4)
        assert (rows[~speaking, 1:] == empty).all()
        assert (rows[speaking, 1:] < empty).all()
        assert out.audio.size == int(speaking.sum()) * 4 * 16  # 16 samples a frame
