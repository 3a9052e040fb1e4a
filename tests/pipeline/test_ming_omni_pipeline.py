"""The Ming-Omni pipeline (thinker -> talker -> vocoder, the packaged demo-ming-omni deploy) on
the tiny float64 checkpoint: what scheduling and batching may and may not change.

- Sync and async scheduling give the same thinker ids, talker speech ids and audio bytes,
  with seeded sampling in every stage, and the talker and the vocoder receive
  byte-identical payloads (thinker -> talker: prompt ids, reply ids, per-position rows;
  talker -> vocoder: the speech ids; `meta.finished` in each).
- The vocoder stage's audio is the offline vocoder's (`MingToken2Wav`) on the talker's ids
  with the same seed and voice.
- Each request alone gives what it gives in a batch (ids exactly; the rows to float64
  rounding: a batch runs other GEMM shapes).
- Every request's thinker -> talker payload arrives once, with `meta.finished` set once;
  a streaming client sees one finished output per request, and its audio pieces join
  to the whole run's audio bytes.
- Prompts with images, with an audio clip, and with both (their rows and per-token
  routing in the thinker) next to a text one: sync ≡ async, alone ≡ batched.
- A voice the checkpoint lacks is a ValueError naming `voice`, before any stage runs; a
  reply with no text to speak fails only its own request.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from omnistage import SamplingParams
from omnistage.core.payload import unpack_payload
from omnistage.families.ming_omni.tiny import make_tiny_ming_omni
from omnistage.pipeline.omni import AsyncOmni, Omni
from omnistage.testing.payload_equality import assert_same_payload
from omnistage.testing.tiny_deploys import tiny_speech_deploy
from tests.pipeline.pipeline_runs import run_recorded

PROMPTS = [
    "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nSay a long sentence about cats<|im_end|>\n<|im_start|>assistant\n",
]
PARAMS = {
    "thinker": SamplingParams(temperature=0.8, seed=100, max_tokens=10),
    "talker": SamplingParams(temperature=1.0, top_k=20, seed=7, max_tokens=24),
    "vocoder": SamplingParams(seed=5),
}
EDGE = "thinker->talker"
VOCODER_EDGE = "talker->vocoder"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_ming_omni(tmp_path_factory.mktemp("ming-omni"), dtype=torch.float64)


def _deploy(ckpt, async_scheduling: bool):
    return tiny_speech_deploy("demo-ming-omni", ckpt, async_scheduling=async_scheduling)


def _run(spec, prompts: list[str]) -> tuple[list, dict]:
    """(per prompt: thinker ids, talker ids, audio bytes), and what the talker and the
    vocoder received, packed."""
    outputs, received = run_recorded(spec, prompts, PARAMS)
    ids = [
        (o.outputs["thinker"].token_ids, o.outputs["talker"].token_ids, o.audio.tobytes())
        for o in outputs
    ]
    return ids, received


@pytest.fixture(scope="module")
def sync_run(ckpt):
    return _run(_deploy(ckpt, False), PROMPTS)


def test_the_talker_writes_speech_ids_from_the_thinker_reply(ckpt, sync_run):
    from omnistage.families.ming_omni.tiny import AUDIO_VOCAB

    ids, received = sync_run
    text_vocab = 270  # the tiny talker tokenizer: 259 byte-level ids + 11 specials
    for thinker_ids, talker_ids, _ in ids:
        assert 0 < len(thinker_ids) <= 10
        assert 0 < len(talker_ids) <= 24
        speech = [t for t in talker_ids if t >= text_vocab]
        assert speech == talker_ids[: len(speech)]
        assert all(t < text_vocab + AUDIO_VOCAB for t in speech)
    assert sorted({edge for (_, edge, _) in received}) == [VOCODER_EDGE, EDGE]


def test_sync_and_async_give_identical_ids_and_payloads(ckpt, sync_run):
    ids, received = sync_run
    async_ids, async_received = _run(_deploy(ckpt, True), PROMPTS)
    assert ids == async_ids
    assert received.keys() == async_received.keys()
    for key, data in received.items():
        assert_same_payload(async_received[key], data, key)


def test_alone_equals_batched(ckpt, sync_run):
    ids, received = sync_run
    for i in (2,):  # the longest prompt
        alone_ids, alone_received = _run(_deploy(ckpt, False), [PROMPTS[i]])
        assert alone_ids == [ids[i]]
        assert_same_payload(alone_received[0, EDGE, 0], received[i, EDGE, 0])


def test_meta_finished_exactly_once(ckpt, sync_run):
    _, received = sync_run
    for i in range(len(PROMPTS)):
        for edge in (EDGE, VOCODER_EDGE):
            chunks = [
                unpack_payload(d)
                for (j, e, _), d in sorted(received.items())
                if (j, e) == (i, edge)
            ]
            assert [c["meta.finished"] for c in chunks] == [True], edge

    async def stream() -> list[tuple[int, bytes]]:
        with AsyncOmni(_deploy(ckpt, False), in_process=True) as omni:

            async def one(i: int) -> tuple[int, bytes]:
                finished, audio = 0, []
                async for out in omni.generate(PROMPTS[i], PARAMS, request_id=f"r{i}"):
                    assert out.error is None, out.error
                    finished += out.finished
                    if out.stage == "vocoder" and out.new_data is not None:
                        audio.append(out.new_data.to(torch.float32).numpy().tobytes())
                return finished, b"".join(audio)

            return await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))

    whole = [audio for _, _, audio in sync_run[0]]
    # A streaming client gets the whole run's audio (one piece: the vocoder is not causal).
    assert asyncio.run(stream()) == [(1, audio) for audio in whole]


def test_an_unknown_voice_is_refused_naming_the_field(ckpt):
    with Omni(_deploy(ckpt, False), in_process=True) as omni:
        with pytest.raises(ValueError, match="voice"):
            omni.generate(PROMPTS[:1], PARAMS, voice="nobody")
        (ok,) = omni.generate(PROMPTS[:1], PARAMS, voice="luna")
    assert ok.error is None


def test_a_reply_without_text_fails_only_its_request(ckpt):
    """A thinker that ends at once (`<|im_end|>` forced) leaves the talker nothing to
    speak: that request fails naming why, the other completes, nothing is left held."""
    silent = SamplingParams(temperature=0.0, max_tokens=4, logit_bias={2: 100.0})
    params = [{**PARAMS, "thinker": silent}, PARAMS]
    with Omni(_deploy(ckpt, False), in_process=True) as omni:
        mute, ok = omni.generate(PROMPTS[:2], params)
        counters = omni.stage_counters()
    assert mute.outputs["thinker"].token_ids == [2]
    assert mute.error == "stage talker: the thinker generated no text to speak"
    assert ok.error is None and ok.outputs["talker"].token_ids
    assert all(v == 0 for c in counters.values() for v in c.values()), counters


def test_the_vocoder_speaks_the_talker_ids_as_the_offline_vocoder_does(ckpt, sync_run):
    from omnistage.families.ming_omni.token2wav import MingToken2Wav
    from omnistage.models.generation import GenerationItem

    ids, received = sync_run
    model = MingToken2Wav(ckpt, torch.float64)
    for i, (_, talker_ids, audio) in enumerate(ids):
        sent = unpack_payload(received[i, VOCODER_EDGE, 0])["ids.output"]
        assert sent.reshape(-1).tolist() == talker_ids
        item = GenerationItem(rows=sent, seed=5, speaker="luna")
        expected = model.generate([item])[0].numpy()
        assert len(audio) > 0 and audio == expected.tobytes()


def test_image_prompts_sync_equals_async_and_alone_equals_batched(ckpt):
    """Prompts with images (image rows and image routing in the thinker) mixed with a text
    one: sync ≡ async (ids, audio, payloads) and alone ≡ batched."""
    import numpy as np

    rng = np.random.default_rng(1)
    one, two, three = (rng.integers(0, 256, (60, 90, 3), dtype=np.uint8) for _ in range(3))
    user = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    prompts = [
        {"prompt": user.format("<image>What is it?"), "multi_modal_data": {"image": [one]}},
        PROMPTS[1],
        {
            "prompt": user.format("Compare <image> with <image>."),
            "multi_modal_data": {"image": [two, three]},
        },
    ]
    ids, received = _run(_deploy(ckpt, False), prompts)
    async_ids, async_received = _run(_deploy(ckpt, True), prompts)
    assert ids == async_ids
    assert received.keys() == async_received.keys()
    for key, data in received.items():
        assert_same_payload(async_received[key], data, key)
    alone_ids, alone_received = _run(_deploy(ckpt, False), [prompts[2]])
    assert alone_ids == [ids[2]]
    assert_same_payload(alone_received[0, EDGE, 0], received[2, EDGE, 0])
    text_ids, _ = _run(_deploy(ckpt, False), [PROMPTS[1]])
    assert text_ids == [ids[1]]


def test_audio_prompts_sync_equals_async_and_alone_equals_batched(ckpt):
    """Prompts with an audio clip (fbank, SANM rows and audio routing in the thinker), one
    with an image too, mixed with a text one: sync ≡ async (ids, audio, payloads) and
    alone ≡ batched."""
    import numpy as np

    rng = np.random.default_rng(2)
    clips = [(0.2 * rng.standard_normal(n)).astype(np.float32) for n in (9000, 16000)]
    image = rng.integers(0, 256, (60, 90, 3), dtype=np.uint8)
    user = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    prompts = [
        {
            "prompt": user.format("<audio>What is said?"),
            "multi_modal_data": {"audio": [(clips[0], 16000)]},
        },
        PROMPTS[1],
        {
            "prompt": user.format("<image> and <audio>: describe both."),
            "multi_modal_data": {"image": [image], "audio": [(clips[1], 16000)]},
        },
    ]
    ids, received = _run(_deploy(ckpt, False), prompts)
    async_ids, async_received = _run(_deploy(ckpt, True), prompts)
    assert ids == async_ids
    assert received.keys() == async_received.keys()
    for key, data in received.items():
        assert_same_payload(async_received[key], data, key)
    alone_ids, alone_received = _run(_deploy(ckpt, False), [prompts[2]])
    assert alone_ids == [ids[2]]
    assert_same_payload(alone_received[0, EDGE, 0], received[2, EDGE, 0])
