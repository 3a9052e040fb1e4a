"""Covo-Audio (fused thinker+talker -> code2wav, the packaged demo-covo-audio deploy) on its
tiny checkpoint.

- The per-family token filter: code2wav speaks the speech codes among the LM's ids (ids
  from `audio_token_index` to the end of the codebook, minus `audio_token_index`), in order;
  text and control ids are dropped.
- Parity: code2wav's audio equals the reference's (Tencent/Covo-Audio `token2wav.decode`,
  float32, `fixtures/covo_audio/reference.pt`) within 1e-5 (7.5e-8 measured); through the
  pipeline the LM's greedy ids are the reference's (`CovoAudioForCausalLM`) exactly and the
  audio is the reference's decode of the reference's own filtered ids, whole and streamed.
- Audio in: a clip's rows (log-mel, Whisper encoder, adapter) are the reference's within
  1e-6 (3e-8 measured), its prompt expands as the reference's, and the LM's greedy reply
  to it is the reference's.
- Sync and async scheduling give the same ids, the same payloads into code2wav and the
  same audio bytes (float64, a sampled seeded LM); each request batched equals it alone;
  streamed and whole audio are identical; `meta.finished` is set on exactly one payload
  per request, its last.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.core.payload import unpack_payload
from omnistage.families.covo_audio.code2wav import CovoAudioCode2Wav, speech_codes
from omnistage.families.covo_audio.config import CovoAudioConfig
from omnistage.families.covo_audio.tiny import CODEBOOK, make_tiny_covo_audio
from omnistage.models.generation import GenerationItem
from omnistage.multimodal.chat import render_chat
from omnistage.pipeline.omni import Omni
from omnistage.testing.tiny_deploys import tiny_speech_deploy
from tests.pipeline.pipeline_runs import _record_gets

FIXTURE = Path(__file__).parents[1] / "fixtures" / "covo_audio" / "reference.pt"
PROMPTS = {"hi": "Hi", "hello": "Hello there, how are you?", "long": "Tell me a story."}
LM = "fused_thinker_talker"
SEED = 7  # the fixture's noise seed


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_covo_audio(tmp_path_factory.mktemp("covo") / "tiny")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _messages(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}]}


def _streamed(spec, first: int = 3, chunk: int = 4, left: int = 100000):
    (edge,) = spec.edges
    edge = dataclasses.replace(
        edge, transfer="stream", first_chunk_size=first, chunk_size=chunk, left_context=left
    )
    return dataclasses.replace(spec, edges=(edge,))


def test_the_token_filter_keeps_the_speech_codes_in_order():
    index = 262
    ids = torch.tensor([5, index, 261, index + 9, 2, index + CODEBOOK - 1, index + CODEBOOK, 40])
    assert speech_codes(ids, index, CODEBOOK).tolist() == [0, 9, CODEBOOK - 1]
    assert speech_codes(torch.tensor([1, 2, 261]), index, CODEBOOK).numel() == 0
    assert speech_codes(torch.zeros(0, dtype=torch.int64), index, CODEBOOK).numel() == 0


def test_a_reply_without_speech_codes_is_no_audio(checkpoint):
    """Only text and control ids: nothing to speak (no `-1` stand-in code decoded)."""
    config = CovoAudioConfig.from_pretrained(checkpoint)
    model = CovoAudioCode2Wav.from_checkpoint(checkpoint, config, torch.float32)
    text = GenerationItem(torch.tensor([40, 41, 259, 260, 261, 2]), seed=0)
    speech = GenerationItem(torch.tensor([40, 262 + 5, 41, 262 + 9, 2]), seed=0)
    empty, spoken = model.generate([text, speech])
    assert empty.numel() == 0
    assert torch.equal(spoken, model.decode(torch.tensor([5, 9]), 0)) and spoken.numel() == 20


def test_code2wav_equals_the_reference(checkpoint):
    reference = torch.load(FIXTURE, weights_only=True)
    config = CovoAudioConfig.from_pretrained(checkpoint)
    model = CovoAudioCode2Wav.from_checkpoint(checkpoint, config, torch.float32)
    cases = [k for k in reference if k.startswith("audio/")]
    assert len(cases) == 4
    for case in cases:
        expected = reference[case]
        audio = model.decode(expected["codes"], expected["seed"])
        assert audio.shape == expected["audio"].shape, case
        torch.testing.assert_close(audio, expected["audio"], rtol=0, atol=1e-5)
        assert expected["audio"].abs().max() < 0.9  # not saturated: tanh would hide errors
    other = model.decode(reference["audio/fixed"]["codes"], SEED + 1)
    assert not torch.allclose(other, reference["audio/fixed"]["audio"], atol=1e-3)


def test_greedy_ids_and_audio_equal_the_reference_whole_and_streamed(checkpoint):
    reference = torch.load(FIXTURE, weights_only=True)
    params = {
        LM: SamplingParams(temperature=0.0, max_tokens=24),
        "code2wav": SamplingParams(seed=SEED),
    }
    whole = tiny_speech_deploy(
        "demo-covo-audio", checkpoint, dtype="float32", async_scheduling=False
    )
    for spec in (whole, _streamed(whole)):
        with Omni(spec, in_process=True) as omni:
            outs = omni.generate([_messages(t) for t in PROMPTS.values()], params)
        for name, out in zip(PROMPTS, outs, strict=True):
            assert out.error is None, out.error
            assert out.token_ids == reference[f"lm/{name}"]["output"].tolist(), name
            expected = reference[f"audio/{name}"]["audio"].numpy()
            assert out.audio.shape == expected.shape, name
            np.testing.assert_allclose(out.audio, expected, rtol=0, atol=1e-5)
    assert any(t < 262 for t in reference["lm/long"]["output"].tolist())  # text among codes


class _Recorded:
    """An in-process pipeline that keeps every payload code2wav receives."""

    def __init__(self, spec) -> None:
        self.omni = Omni(spec, in_process=True)
        self.got: dict[str, bytes] = {}
        for client in self.omni.orchestrator.clients.values():
            for connector in client.core.connectors.values():
                _record_gets(connector, self.got)

    def run(self, prompts, params):
        """Final outputs, and the payloads code2wav received: (prompt index, chunk) -> it."""
        self.got.clear()
        outs = self.omni.generate(prompts, params)
        assert [o.error for o in outs] == [None] * len(prompts)
        index = {o.request_id: i for i, o in enumerate(outs)}
        received = {}
        for key, data in self.got.items():
            rid, _, chunk = key.rsplit("/", 2)
            received[index[rid], int(chunk)] = unpack_payload(data)
        return outs, received


SAMPLED = {LM: SamplingParams(temperature=1.0, top_p=0.9, seed=3, max_tokens=20)}
TEXTS = ["Hi", "Say something long.", "Yes"]


def _finished_once(received, n: int) -> None:
    """`meta.finished` on exactly one payload per request: its last."""
    for i in range(n):
        chunks = sorted(c for (j, c) in received if j == i)
        finished = [c for c in chunks if received[i, c]["meta.finished"]]
        assert finished == [chunks[-1]], (i, chunks)


def test_sync_equals_async_batched_equals_alone_stream_equals_whole(checkpoint):
    prompts = [_messages(t) for t in TEXTS]
    asyn = tiny_speech_deploy("demo-covo-audio", checkpoint, async_scheduling=True)
    sync = tiny_speech_deploy("demo-covo-audio", checkpoint, async_scheduling=False)
    runs = {}
    for name, spec in (("async", asyn), ("sync", sync), ("stream", _streamed(sync))):
        recorded = _Recorded(spec)
        with recorded.omni as omni:
            runs[name] = recorded.run(prompts, SAMPLED)
            if name == "async":
                alone = [recorded.run([p], SAMPLED)[0][0] for p in prompts]
            assert all(v == 0 for st in omni.stage_counters().values() for v in st.values())
    a_outs, a_received = runs["async"]
    for other in (runs["sync"][0], runs["stream"][0], alone):
        for a, b in zip(a_outs, other, strict=True):
            assert a.token_ids == b.token_ids
            assert a.audio.tobytes() == b.audio.tobytes()
    s_received = runs["sync"][1]
    assert a_received.keys() == s_received.keys()
    for key, payload in a_received.items():
        assert torch.equal(payload["ids.output"], s_received[key]["ids.output"]), key
    assert len({o.audio.size for o in a_outs}) > 1 and all(o.audio.size for o in a_outs)
    _finished_once(a_received, len(prompts))
    _finished_once(runs["stream"][1], len(prompts))
    assert max(c for (_, c) in runs["stream"][1]) > 1  # really streamed in chunks


def test_a_stream_whose_left_context_misses_its_start_fails_clearly(checkpoint):
    spec = tiny_speech_deploy("demo-covo-audio", checkpoint, async_scheduling=False)
    spec = _streamed(spec, first=2, chunk=2, left=2)
    params = {LM: SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)}
    with Omni(spec, in_process=True) as omni:
        (out,) = omni.generate([_messages("Tell me a story.")], params)
        assert out.error is not None and "left_context" in out.error
        (after,) = omni.generate([_messages("Hi")], {LM: SamplingParams(max_tokens=2)})
    assert after.error is None, after.error  # the pipeline goes on serving


def test_audio_in_equals_the_reference(checkpoint):
    """The multimodal processor: a clip's rows are the reference's (log-mel, Whisper encoder,
    adapter) and the LM's greedy reply to them is the reference's, through the pipeline."""
    from omnistage.families.covo_audio.audio_input import CovoAudioInputEncoder

    reference = torch.load(FIXTURE, weights_only=True)["audio_in"]
    wave = reference["wave"].numpy()
    encoder = CovoAudioInputEncoder.from_checkpoint(checkpoint)
    features = encoder.clip_features(wave)
    torch.testing.assert_close(features, reference["features"], rtol=0, atol=1e-6)
    content = [{"type": "audio", "audio": (wave, 16000)}]
    chat = render_chat(
        encoder.tokenizer,
        [{"role": "user", "content": content}],
        placeholders=encoder.tokens.placeholders(),
    )
    encoded = encoder.encode(chat.prompt, [(wave, 16000)])
    assert encoded.prompt_token_ids == reference["prompt"].tolist()
    assert encoded.audio_token_counts == [int((reference["prompt"] == 260).sum())]
    spec = tiny_speech_deploy(
        "demo-covo-audio", checkpoint, dtype="float32", async_scheduling=False
    )
    params = {LM: SamplingParams(temperature=0.0, max_tokens=24)}
    with Omni(spec, in_process=True) as omni:
        (out,) = omni.generate([{"messages": [{"role": "user", "content": content}]}], params)
        assert out.error is None, out.error
        assert out.token_ids == reference["output"].tolist()
        with pytest.raises(ValueError, match="image"):
            image = {"type": "image", "image": np.zeros((8, 8, 3), dtype=np.uint8)}
            omni.generate([{"messages": [{"role": "user", "content": [image]}]}], params)
