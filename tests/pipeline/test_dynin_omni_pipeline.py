"""Dynin-Omni (token2text -> token2image -> token2audio, the packaged dynin-omni deploy) on
its tiny checkpoint: seed 003's two hops of one data plane.

- The flattened prompt metadata (speaker, language, wanted outputs, task, detok_id,
  prompt length) leaves token2text, crosses both hops and reaches token2audio exactly,
  with the tokens (`codes.audio`) passed through token2image unchanged.
- Each hop sends one whole payload with `meta.finished`, exactly once; a payload
  without it is refused, naming the edge processor.
- A consumer waiting for its second hop is parked (no queued work) and, when the
  producer fails, times out with an error naming the producer and the edge; nothing
  stays held.
- A text task is token2text's own final output (the decoders never run); asking one
  request for two outputs is refused, naming `modalities`.
- token2audio speaks: EMOVA's decoder turns the units into a 22050 Hz waveform in the
  request's voice (a style condition); a voice it lacks is refused naming `voice`.
- float64: requests batched give the same tokens, texts, images and speech as each alone; a
  seed (of token2text, which samples image codes and speech units) reproduces an image.
- Bad input fails the request with the field named; the pipeline goes on serving.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.families.dynin_omni.tiny import TINY_STYLES, make_tiny_dynin_omni
from omnistage.models.generation import GenerationItem
from omnistage.pipeline.deploy import load_deploy, packaged_deploy_path
from omnistage.pipeline.messages import (
    DeliverPayload,
    PayloadReady,
    RequestFailed,
    StageOutput,
    SubmitRequest,
)
from omnistage.pipeline.omni import Omni
from omnistage.pipeline.stage_process import make_stage_core

HOP1, HOP2 = "token2text->token2image", "token2image->token2audio"
STAGES = ("token2text", "token2image", "token2audio")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_dynin_omni(tmp_path_factory.mktemp("dynin") / "tiny")


def deploy(checkpoint, dtype: str = "float64", timeout_s: float = 30.0):
    spec = load_deploy(packaged_deploy_path("dynin-omni")).with_model(str(checkpoint))
    spec = spec.with_engine_args({"dtype": dtype})
    stages = tuple(
        dataclasses.replace(s, input_timeout_s=timeout_s) if s.name != "token2text" else s
        for s in spec.stages
    )
    return dataclasses.replace(spec, stages=stages)


@pytest.fixture
def cores(checkpoint, request):
    spec = deploy(checkpoint, timeout_s=getattr(request, "param", 30.0))
    made = {n: make_stage_core(spec.stage(n), spec, f"dynin{id(spec)}") for n in STAGES}
    yield made
    for core in made.values():
        core.shutdown()


def recording(core) -> list[dict]:
    """Wrap `core.on_input` to keep every payload it is handed."""
    seen: list[dict] = []
    original = core.on_input

    def on_input(msg, payload):
        seen.append(dict(payload))
        return original(msg, payload)

    core.on_input = on_input
    return seen


def deliver(ready: PayloadReady) -> DeliverPayload:
    return DeliverPayload(
        request_id=ready.request_id,
        edge=ready.edge,
        handle=ready.handle,
        chunk_index=ready.chunk_index,
        last=ready.last,
    )


def of_type(events, cls) -> list:
    return [e for e in events if isinstance(e, cls)]


def held(cores) -> dict[str, int]:
    return {
        f"{n}.{k}": v
        for n, c in cores.items()
        for k, v in c.counters().items()
        if k in ("coordinator_entries", "connector_pending", "queued_items")
    }


def test_metadata_crosses_both_hops_exactly_once_each(cores):
    first, second, third = (cores[n] for n in STAGES)
    into_image, into_audio = recording(second), recording(third)
    submit = SubmitRequest(
        request_id="r",
        prompt="hello",
        voice=TINY_STYLES[2],
        language="en",
        modalities=["audio"],
        send_to=[HOP1],
    )
    assert first.handle(submit) == []
    events = first.run_step()
    (hop1,) = of_type(events, PayloadReady)
    assert hop1.edge == HOP1 and hop1.last and hop1.chunk_index == 0
    tokens = of_type(events, StageOutput)[0]

    parked = SubmitRequest(request_id="r", wait_for=[HOP1], send_to=[HOP2])
    assert second.handle(parked) == [] and second.counters()["queued_items"] == 0
    assert second.handle(deliver(hop1)) == []
    events = second.run_step()
    (hop2,) = of_type(events, PayloadReady)
    assert hop2.edge == HOP2 and hop2.last

    assert third.handle(SubmitRequest(request_id="r", wait_for=[HOP2])) == []
    assert third.handle(deliver(hop2)) == []
    (speech,) = of_type(third.run_step(), StageOutput)
    assert speech.finished and speech.data is not None and speech.data.shape[0] > 0

    (p1,), (p2,) = into_image, into_audio
    meta = {
        "meta.speaker": TINY_STYLES[2],
        "meta.language": "en",
        "meta.modalities": "audio",
        "meta.task": "t2s",
        "meta.detok_id": 2,
        "meta.prompt_length": 5,
        "meta.finished": True,
    }
    for payload in (p1, p2):
        assert {k: v for k, v in payload.items() if k.startswith("meta.")} == meta
    assert torch.equal(p1["codes.audio"], p2["codes.audio"])
    assert p1["codes.audio"].dtype == torch.long and p1["codes.audio"].numel() > 0
    assert tokens.data is not None
    assert all(v == 0 for v in held(cores).values()), held(cores)


def test_a_hop_without_meta_finished_is_refused(cores):
    processor = cores["token2image"].processor
    with pytest.raises(ValueError, match="dynin_token2image.*meta.finished"):
        processor.to_meta({"codes.audio": torch.arange(3), "meta.task": "t2i"})
    with pytest.raises(ValueError, match="metadata field 'voice'"):
        processor.from_generation({"voice": "x"}, torch.arange(3))


@pytest.mark.parametrize("cores", [0.2], indirect=True)
def test_parked_consumer_times_out_naming_the_edge_when_its_producer_fails(cores):
    first, second, third = (cores[n] for n in STAGES)
    assert third.handle(SubmitRequest(request_id="r", wait_for=[HOP2])) == []
    assert third.counters()["coordinator_entries"] == 1
    assert third.counters()["queued_items"] == 0  # parked: no work until its payload

    # The producer fails the request (its image codes are outside the codebook) and sends
    # nothing on the second hop.
    assert second.handle(SubmitRequest(request_id="r", wait_for=[HOP1], send_to=[HOP2])) == []
    bad = {"codes.audio": torch.full((16,), 999), "meta.detok_id": 1, "meta.finished": True}
    ((edge, _),) = first.outgoing
    (hop1,) = first.send_payloads("r", [(edge, 0, bad, True)])
    (failed,) = second.handle(deliver(hop1))
    assert isinstance(failed, RequestFailed) and "codes.audio" in failed.message

    assert third.check_timeouts() == []
    time.sleep(0.3)
    (timed_out,) = third.check_timeouts()
    assert timed_out.request_id == "r"
    assert timed_out.message == (
        "no input from stage token2image on edge token2image->token2audio within 0.2 s"
    )
    assert all(v == 0 for v in held(cores).values()), held(cores)


def test_tokens_of_every_task_alone_equal_batched_float64(cores):
    core = cores["token2text"]
    model = core.model
    prompts = ["a cat", "two dogs on a hill", "x"]
    for task in ("text", "image", "audio"):

        def item(prompt, task=task):
            return GenerationItem(model.prompt_rows(prompt, None), meta={"modalities": task})

        alone = [model.generate([item(p)])[0] for p in prompts]
        batched = model.generate([item(p) for p in prompts])
        for a, b in zip(alone, batched, strict=True):
            assert torch.equal(a, b), task
        assert len({tuple(a.tolist()) for a in alone}) > 1, task  # prompts matter


def test_images_alone_equal_batched_through_the_pipeline_float64(checkpoint):
    prompts = ["a cat", "two dogs on a hill", "x", "a red house"]
    with Omni(deploy(checkpoint), in_process=True) as omni:
        batched = omni.generate(prompts, modalities=["image"])
        alone = [omni.generate(p, modalities=["image"])[0] for p in prompts]
        for a, b in zip(alone, batched, strict=True):
            assert a.error is None and b.error is None, (a.error, b.error)
            assert np.asarray(a.image).shape == (8, 8, 3)
            np.testing.assert_array_equal(np.asarray(a.image), np.asarray(b.image))
        assert len({np.asarray(a.image).tobytes() for a in alone}) == len(prompts)
        assert all(v == 0 for s in omni.stage_counters().values() for v in s.values())


def test_text_answers_are_token2text_final_output(checkpoint):
    prompts = ["hello", "a cat on a mat", "Why?"]
    with Omni(deploy(checkpoint), in_process=True) as omni:
        batched = omni.generate(prompts, modalities=["text"])
        alone = [omni.generate(p, modalities=["text"])[0] for p in prompts]
    for a, b in zip(alone, batched, strict=True):
        assert a.error is None and b.error is None, (a.error, b.error)
        assert a.text == b.text and a.outputs["token2text"].token_ids
        assert set(a.outputs) == {"token2text"}  # the decoders never ran
    assert len({a.text for a in alone}) == len(prompts)


def test_a_seed_reproduces_the_image_and_another_changes_it(checkpoint):
    with Omni(deploy(checkpoint), in_process=True) as omni:
        images = [
            np.asarray(
                omni.generate(
                    "a cat", {"token2text": SamplingParams(seed=s)}, modalities=["image"]
                )[0].image
            )
            for s in (3, 3, 4)
        ]
    assert np.array_equal(images[0], images[1]) and not np.array_equal(images[0], images[2])


def test_bad_input_names_the_field_and_the_pipeline_serves_on(checkpoint):
    with Omni(deploy(checkpoint, dtype="float32"), in_process=True) as omni:
        with pytest.raises(ValueError, match="prompt"):
            omni.generate("", modalities=["image"])
        (out,) = omni.generate("hi", modalities=["image", "audio"])
        assert out.error is not None and "modalities: Dynin-Omni writes one output" in out.error
        (out,) = omni.generate({"prompt_token_ids": [5, 100000]}, modalities=["image"])
        assert out.error is not None and "prompt_token_ids" in out.error
        (out,) = omni.generate("x" * 600, modalities=["text"])
        assert out.error is not None and "prompt: 600 tokens" in out.error
        (out,) = omni.generate("x" * 600, modalities=["image"])  # cut by the t2i template
        assert out.error is None and np.asarray(out.image).shape == (8, 8, 3)
        with pytest.raises(ValueError, match="voice: 'alice' is not one of"):
            omni.generate("say hi", modalities=["audio"], voice="alice")
        (out,) = omni.generate({"prompt_token_ids": [5, -1]}, modalities=["audio"])
        assert out.error is not None and "prompt_token_ids" in out.error
        (out,) = omni.generate("still serving", modalities=["image"])
        assert out.error is None and np.asarray(out.image).shape == (8, 8, 3)


def test_speech_alone_equals_batched_and_voices_and_seeds_matter_float64(checkpoint):
    prompts = ["hello there", "a cat", "x"]
    with Omni(deploy(checkpoint), in_process=True) as omni:
        batched = omni.generate(prompts, modalities=["audio"])
        alone = [omni.generate(p, modalities=["audio"])[0] for p in prompts]
        for a, b in zip(alone, batched, strict=True):
            assert a.error is None and b.error is None, (a.error, b.error)
            assert a.sample_rate == 22050 and a.audio.dtype == np.float32
            np.testing.assert_array_equal(a.audio, b.audio)
            assert a.audio.size > 0 and np.abs(a.audio).max() <= 1.0
        assert len({a.audio.tobytes() for a in alone}) == len(prompts)
        voiced = [
            omni.generate("hello there", modalities=["audio"], voice=v)[0].audio
            for v in (TINY_STYLES[1], TINY_STYLES[0])
        ]
        assert np.array_equal(voiced[0], alone[0].audio)  # the default style
        assert not np.array_equal(voiced[0], voiced[1])
        assert all(v == 0 for s in omni.stage_counters().values() for v in s.values())
