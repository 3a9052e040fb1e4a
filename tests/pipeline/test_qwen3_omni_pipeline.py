"""The Qwen3-Omni pipeline (thinker -> talker -> code2wav, the packaged demo-omni deploy) on
the tiny float64 checkpoint: what scheduling and streaming may and may not change.

- Sync and async scheduling give the same text and bit-identical audio, with a sampled
  (seeded) talker: every draw is keyed by (request seed, output position), never by
  batch row or step timing.
- Streamed (thinker -> talker and talker -> code2wav), the audio, concatenated, equals
  the whole-payload audio within 1e-5. The talker's frames are the same either way (each
  waits for its text row); code2wav's chunks are decoded with 32 frames of left context; the tiny code2wav's receptive field is
  longer (an 8-frame attention window per transformer layer, then the convolutions'
  context), so a seam sample can differ from the whole decode by what the frames
  beyond the context still contribute (measured ~1e-7 here). Chunk boundaries and
  lengths are exact: each chunk returns exactly the samples the whole decode has there.
- 50 concurrent requests, text-only and text+audio mixed, all complete, and every
  stage's counters and shared-memory segments are back to zero afterwards.
- A talker made to end at `codec_eos` at a known step: its end frame reaches code2wav,
  which decodes exactly the frames before it.
"""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.families.qwen3_omni.tiny import make_tiny_qwen3_omni
from omnistage.pipeline.omni import AsyncOmni, Omni
from omnistage.testing.tiny_deploys import tiny_qwen3_omni_deploy

PROMPTS = [
    "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|>user\nSay a long sentence about cats<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_qwen3_omni(tmp_path_factory.mktemp("qwen3-omni-pipe"), dtype=torch.float64)


PARAMS = {
    "thinker": SamplingParams(temperature=0.8, seed=100, max_tokens=12),
    "talker": SamplingParams(
        temperature=0.9, top_k=50, repetition_penalty=1.05, seed=7, max_tokens=48
    ),
}


@pytest.fixture(scope="module")
def omni(ckpt):
    """The default deploy (async scheduling, streamed edges), started once for the tests
    that only send it requests (seeded: a request's outputs do not depend on what the
    pipeline ran before)."""
    with Omni(tiny_qwen3_omni_deploy(ckpt), in_process=True) as pipeline:
        yield pipeline


def _run(spec) -> list:
    """The prompts as one batch on a pipeline of `spec`."""
    with Omni(spec, in_process=True) as omni:
        return _generate(omni)


def _generate(omni) -> list:
    """The prompts as one batch (their steps interleave in every stage)."""
    results = omni.generate(PROMPTS, PARAMS)
    for out in results:
        assert out.error is None, out.error
        assert out.audio is not None and out.audio.size > 0
    return results


def test_sync_and_async_scheduling_give_identical_text_and_audio(ckpt, omni):
    sync = _run(tiny_qwen3_omni_deploy(ckpt, async_scheduling=False))
    asyn = _generate(omni)  # async scheduling
    for a, b in zip(sync, asyn, strict=True):
        assert a.token_ids == b.token_ids
        assert np.array_equal(a.audio, b.audio)


def test_streamed_audio_equals_whole_payload_audio(ckpt, omni):
    streamed = _generate(omni)  # streamed edges
    whole = _run(tiny_qwen3_omni_deploy(ckpt, stream=False))
    for s, w in zip(streamed, whole, strict=True):
        assert s.token_ids == w.token_ids
        assert s.audio.shape == w.audio.shape
        np.testing.assert_allclose(s.audio, w.audio, rtol=0, atol=1e-5)
    # The longest reply is streamed in several chunks (first 4 frames, then 16).
    assert max(s.audio.size for s in streamed) > 64 * 20


def test_fifty_concurrent_mixed_requests_complete_and_leave_nothing(ckpt):
    async def run() -> list:
        with AsyncOmni(tiny_qwen3_omni_deploy(ckpt)) as omni:

            async def one(i: int):
                modalities = ["text"] if i % 3 == 0 else None
                last = None
                chunks = 0
                async for out in omni.generate(PROMPTS[i % 3], PARAMS, modalities):
                    chunks += out.new_data is not None and out.new_data.numel() > 0
                    last = out
                return i, last, chunks

            results = await asyncio.gather(*(one(i) for i in range(50)))
            counters = omni.stage_counters()
            return results, counters, omni.orchestrator.namespace

    results, counters, namespace = asyncio.run(run())
    for i, out, chunks in results:
        assert out.finished and out.error is None, out.error
        if i % 3 == 0:
            assert out.audio is None and set(out.outputs) == {"thinker"}
        else:
            assert out.audio is not None and chunks >= 2  # streamed: several audio chunks
    for stage, values in counters.items():
        assert all(v == 0 for v in values.values()), (stage, values)
    leftover = [f for f in os.listdir("/dev/shm") if namespace in f]
    assert leftover == []


def test_bad_input_is_refused_before_any_stage_runs(ckpt, omni, tmp_path):
    import dataclasses

    spec = tiny_qwen3_omni_deploy(ckpt)
    stages = tuple(
        dataclasses.replace(s, model_part="vocoder") if s.name == "code2wav" else s
        for s in spec.stages
    )
    with pytest.raises(ValueError, match=r"code2wav\]\.model_part: qwen3_omni_moe .* 'vocoder'"):
        Omni(dataclasses.replace(spec, stages=stages), in_process=True)
    whole = tuple(
        dataclasses.replace(s, model_part=None) if s.name == "talker" else s for s in spec.stages
    )
    with pytest.raises(ValueError, match="multi-part qwen3_omni_moe checkpoint"):
        Omni(dataclasses.replace(spec, stages=whole), in_process=True)

    (tmp_path / "noise.wav").write_bytes(b"RIFF....WAVEfmt not really")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    prompt = PROMPTS[0]
    stage_requests = lambda: sum(  # noqa: E731
        c["engine_requests"] for c in omni.stage_counters().values() if "engine_requests" in c
    )
    cases = [
        (
            {"prompt": prompt, "multi_modal_data": {"audio": str(tmp_path / "noise.wav")}},
            "audio: cannot",
        ),
        (
            {"prompt": prompt, "multi_modal_data": {"audio": (np.zeros(100), 0)}},
            "sampling_rate",
        ),
        ({"prompt": prompt, "multi_modal_data": {"audio": (np.zeros(100), 8000)}}, "too short"),
        (
            {"prompt": prompt, "multi_modal_data": {"image": str(tmp_path / "broken.png")}},
            "image: cannot decode",
        ),
        (
            {"prompt": prompt, "multi_modal_data": {"video": "x"}},
            "unsupported modality 'video'",
        ),
        ({"prompt": prompt, "extra": 1}, "unknown field 'extra'"),
        ({"messages": "hi"}, "messages: expected a list"),
    ]
    for bad, match in cases:
        with pytest.raises(ValueError, match=match):
            omni.generate([bad])
    with pytest.raises(ValueError, match="modalities: 'image' cannot be produced"):
        omni.generate([prompt], modalities=["image"])
    with pytest.raises(ValueError, match=r"voice: 'alloy' is not one of aiden, chelsie, ethan"):
        omni.generate([prompt], voice="alloy")
    assert stage_requests() == 0
    (out,) = omni.generate([prompt], PARAMS, ["text"])  # and it still serves
    assert out.error is None and out.token_ids


def test_a_text_model_refuses_audio_input(tmp_path):
    from omnistage.testing.tiny_pipeline import make_tiny_omni, tiny_pipeline_deploy

    with Omni(tiny_pipeline_deploy(make_tiny_omni(tmp_path / "tiny")), in_process=True) as omni:
        clip = (np.zeros(16000, dtype=np.float32), 16000)
        with pytest.raises(ValueError, match="audio: this model does not accept audio input"):
            omni.generate([{"prompt": "hi", "multi_modal_data": {"audio": clip}}])


def test_an_image_question_gets_the_engine_s_answer_through_the_pipeline(ckpt, omni):
    """The thinker stage encodes the image with the model's processor and vision encoder
    and decodes with 3-D positions and deepstack (tests/multimodal prove those equal
    transformers); through the pipeline it answers exactly as the engine does directly."""
    from omnistage.config import EngineConfig
    from omnistage.engine.llm_engine import LLMEngine
    from omnistage.families.qwen3_omni.input_encoder import Qwen3OmniInputEncoder

    image = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    messages = [
        {
            "role": "user",
            "content": [{"type": "image", "image": image}, {"type": "text", "text": "?"}],
        }
    ]
    greedy = SamplingParams(temperature=0, max_tokens=8)
    (out,) = omni.generate([{"messages": messages}], {"thinker": greedy}, ["text"])
    assert out.error is None, out.error
    encoder = Qwen3OmniInputEncoder.from_checkpoint(ckpt, torch.float64)
    encoded = encoder.encode_chat(messages)
    assert encoded.uses_mrope
    engine = LLMEngine(
        EngineConfig(model=str(ckpt), model_part="thinker", dtype="float64", async_scheduling=False)
    )
    engine.add_encoded_request("r", encoded, greedy)
    while engine.has_unfinished_requests():
        (done,) = engine.step()
    engine.shutdown()
    assert out.token_ids == done.outputs[0].token_ids


def test_a_talker_ending_at_codec_eos_gives_the_audio_of_the_frames_before_it(omni):
    """The tiny talker never ends by itself (its `codec_eos` row is zeroed); here a bias
    on `codec_eos` with `min_tokens` 9 makes it write 9 speech frames, then the end frame
    (its stop token), which streams to code2wav with them, mid-way through the last chunk.
    The audio is that of exactly the 9 frames before the end frame."""
    from omnistage.families.qwen3_omni.tiny_config import CODEC_IDS
    from omnistage.models.generation import GenerationItem

    eos = CODEC_IDS["codec_eos_token_id"]
    talker = SamplingParams(
        temperature=0.9, top_k=50, seed=7, min_tokens=9, max_tokens=40, logit_bias={eos: 100.0}
    )
    vocoder = omni.orchestrator.stages.clients["code2wav"].core.model
    seen: list[GenerationItem] = []
    decode = vocoder.generate
    vocoder.generate = lambda items: seen.extend(items) or decode(items)
    try:
        (out,) = omni.generate(PROMPTS[:1], {**PARAMS, "talker": talker})
    finally:
        del vocoder.generate  # the module's pipeline decodes as before
    assert out.error is None, out.error
    frames = torch.cat([item.rows[item.context_len : item.own_end] for item in seen])
    assert frames.shape[0] == 10 and int(frames[9, 0]) == eos  # 9 speech frames, the end
    assert [item.rows.shape[0] - item.context_len for item in seen] == [4, 6]
    (expected,) = decode([GenerationItem(frames[:9])])
    assert out.audio.shape == tuple(expected.shape) == (9 * vocoder.upsample - vocoder.trim,)
    np.testing.assert_allclose(out.audio, expected.numpy(), rtol=0, atol=1e-5)
