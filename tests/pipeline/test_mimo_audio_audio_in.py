"""MiMo-Audio with a spoken prompt (`audio_input.py`) on the tiny checkpoint.

- Parity: a chat turn whose content is one clip renders and expands to the reference's
  prompt (its `InputSegment` layout of the encoder's codes), and the greedy reply's text
  tokens and every code equal the official code's (`fixtures/mimo_audio/encoder.json`,
  `audio_in`; float32).
- Sync and async scheduling give identical tokens, payload bytes and audio with audio in
  (float64, sampled and seeded), batched beside a text prompt; the spoken prompt alone
  equals it batched.
- A clip too short to encode, and a prompt whose audio spans and clips disagree, are
  errors naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from omnistage import SamplingParams
from omnistage.core.payload import unpack_payload
from omnistage.families.mimo_audio.tiny import make_tiny_mimo_audio, tiny_clip
from omnistage.models.loader import resolve_model
from omnistage.multimodal import load_input_encoder
from omnistage.testing.tiny_deploys import tiny_speech_deploy
from tests.pipeline.test_mimo_audio_pipeline import run

FIXTURE = Path(__file__).parents[1] / "fixtures" / "mimo_audio" / "encoder.json"


@pytest.fixture(scope="module")
def case() -> dict:
    return json.loads(FIXTURE.read_text())["audio_in"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    seed = json.loads(FIXTURE.read_text())["seed"]
    return make_tiny_mimo_audio(tmp_path_factory.mktemp("mimo") / "tiny", seed)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _spoken(samples: int, text: str | None = None) -> dict:
    content = [{"type": "audio", "audio": tiny_clip(samples).numpy(), "sampling_rate": 16000}]
    if text is not None:
        content.append({"type": "text", "text": text})
    return {"messages": [{"role": "user", "content": content}]}


def test_the_spoken_prompt_is_the_reference_layout(checkpoint, case) -> None:
    from transformers import AutoTokenizer

    view = resolve_model(str(checkpoint)).path
    tok = AutoTokenizer.from_pretrained(view)
    messages = _spoken(case["samples"])["messages"]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    encoder = load_input_encoder(view)
    encoded = encoder.encode(rendered, [(tiny_clip(case["samples"]).numpy(), case["rate"])])
    assert encoded.prompt_token_ids == case["prompt_token_ids"]
    assert int(encoded.audio_mask.sum()) == case["prompt_token_ids"].count(encoder.marker_ids[1])
    with pytest.raises(ValueError, match=r"prompt: 1 audio placeholder\(s\).* but 0 audio"):
        encoder.encode(rendered, [])
    with pytest.raises(ValueError, match="audio: the clip is too short"):
        encoder.encode(rendered, [(np.zeros(4, dtype=np.float32), 16000)])


def test_greedy_reply_to_audio_equals_the_reference(checkpoint, case) -> None:
    spec = tiny_speech_deploy("demo-mimo-audio", checkpoint, dtype="float32")
    greedy = SamplingParams(temperature=0.0, max_tokens=len(case["tokens"]))
    (out,), received = run(spec, [_spoken(case["samples"])], greedy)
    assert out.token_ids == case["tokens"]
    rows = unpack_payload(received[0, 0])["codes.output"]
    assert rows[:, 1:].reshape(-1, 4, 8).tolist() == case["codes"]


def test_sync_equals_async_with_audio_in(checkpoint) -> None:
    prompts = [_spoken(1600, "Answer."), {"prompt": "Hello"}, _spoken(2000)]
    sampled = SamplingParams(temperature=1.0, top_p=0.9, seed=5, max_tokens=10)
    a = run(tiny_speech_deploy("demo-mimo-audio", checkpoint), prompts, sampled)
    s = run(
        tiny_speech_deploy("demo-mimo-audio", checkpoint, async_scheduling=False), prompts, sampled
    )
    assert [o.token_ids for o in a[0]] == [o.token_ids for o in s[0]]
    assert a[1] == s[1]
    assert [o.audio.tobytes() for o in a[0]] == [o.audio.tobytes() for o in s[0]]
    (alone,), received = run(
        tiny_speech_deploy("demo-mimo-audio", checkpoint), prompts[:1], sampled
    )
    assert alone.token_ids == a[0][0].token_ids and received[0, 0] == a[1][0, 0]
