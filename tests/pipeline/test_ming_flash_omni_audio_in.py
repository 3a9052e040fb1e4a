"""The Ming-flash-omni-2.0 pipeline (thinker -> talker -> audio VAE) with audio prompts, in
float64: chat messages with an audio part and `multi_modal_data` clips.

- Sync and async scheduling give the same thinker ids, talker stop ids and audio bytes,
  and the audio VAE receives byte-identical payloads.
- Each request alone gives what it gives in the batch: ids exactly, audio within 1e-9.
- The clip is read: another clip under the same text changes the thinker's ids.
- Bad audio is a ValueError naming `audio` before any stage runs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.families.ming_flash_omni.tiny import make_tiny_ming_flash_omni
from omnistage.pipeline.omni import Omni
from omnistage.testing.payload_equality import assert_same_payload
from omnistage.testing.tiny_deploys import tiny_speech_deploy
from tests.pipeline.pipeline_runs import run_recorded

PARAMS = {
    "thinker": SamplingParams(temperature=0.8, seed=100, max_tokens=4),
    "talker": SamplingParams(temperature=1.0, seed=7, max_tokens=8),
}


def _clip(seconds: float, hz: float) -> np.ndarray:
    t = np.arange(int(seconds * 16000)) / 16000
    return (0.4 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _spoken(clip: np.ndarray, text: str) -> dict:
    part = {"type": "audio", "audio": clip, "sampling_rate": 16000}
    return {"messages": [{"role": "user", "content": [part, {"type": "text", "text": text}]}]}


PROMPTS = [
    _spoken(_clip(0.4, 300), "What is it?"),
    {
        "prompt": "<|im_start|>user\nOne <audio> two<|im_end|>\n<|im_start|>assistant\n",
        "multi_modal_data": {"audio": [(_clip(0.25, 900), 16000)]},
    },
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_ming_flash_omni(tmp_path_factory.mktemp("ming-flash-ain"), dtype=torch.float64)


def _deploy(ckpt, async_scheduling: bool):
    return tiny_speech_deploy("demo-ming-flash-omni", ckpt, async_scheduling=async_scheduling)


def _run(spec, prompts) -> tuple[list, dict]:
    outputs, received = run_recorded(spec, prompts, PARAMS)
    ids = [
        (o.outputs["thinker"].token_ids, o.outputs["talker"].token_ids, np.asarray(o.audio))
        for o in outputs
    ]
    return ids, received


def test_audio_prompts_sync_equals_async_and_alone_equals_batched(ckpt):
    ids, received = _run(_deploy(ckpt, False), PROMPTS)
    async_ids, async_received = _run(_deploy(ckpt, True), PROMPTS)
    for (t, k, a), (t2, k2, a2) in zip(ids, async_ids, strict=True):
        assert (t, k) == (t2, k2) and len(t) > 0 and len(k) > 0
        assert a.tobytes() == a2.tobytes()
    assert received.keys() == async_received.keys() and received
    for key, data in received.items():
        assert_same_payload(async_received[key], data, key)
    with Omni(_deploy(ckpt, True), in_process=True) as omni:
        for i, prompt in enumerate(PROMPTS):
            (out,) = omni.generate([prompt], PARAMS)
            assert out.error is None
            assert out.outputs["thinker"].token_ids == ids[i][0]
            assert out.outputs["talker"].token_ids == ids[i][1]
            np.testing.assert_allclose(np.asarray(out.audio), ids[i][2], rtol=0, atol=1e-9)
        (other,) = omni.generate([_spoken(_clip(0.4, 2500), "What is it?")], PARAMS)
        assert other.outputs["thinker"].token_ids != ids[0][0]
        for bad, says in (
            (
                {
                    "prompt": "<audio><audio>hi",
                    "multi_modal_data": {"audio": [(_clip(0.2, 300), 16000)]},
                },
                "2 <audio>",
            ),
            (
                {"prompt": "hi", "multi_modal_data": {"audio": [(_clip(0.2, 300), 16000)] * 2}},
                "2 clips",
            ),
            (
                {"prompt": "hi", "multi_modal_data": {"audio": [(_clip(5.0, 300), 16000)]}},
                "longer than",
            ),
        ):
            (out,) = omni.generate([bad], PARAMS)
            assert out.error is not None and "audio" in out.error and says in out.error, out.error
