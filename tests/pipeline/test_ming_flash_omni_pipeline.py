"""The Ming-flash-omni-2.0 pipeline (thinker -> talker -> audio VAE, the packaged
demo-ming-flash-omni deploy) on the tiny float64 checkpoint.

- Sync and async scheduling give the same thinker ids, talker stop ids and audio bytes,
  with seeded sampling in the thinker and the talker (flow head at temperature 1), and the
  audio VAE receives byte-identical payloads: `latents.output` (one float row of
  patch x latent frames per talker step) and `meta.finished`, set in the last chunk of
  each request's stream.
- The audio is the offline decoder's (`MingFlashAudioVAE`) on the received latents, and
  the streamed edge's audio is the whole-payload edge's (to float64 rounding: the stream
  decodes each patch once, after its kept state).
- Each request alone gives what it gives in a batch: ids exactly, audio to float64
  rounding (a batch runs other GEMM shapes).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.core.payload import unpack_payload
from omnistage.families.ming_flash_omni.audio_vae import MingFlashAudioVAE
from omnistage.families.ming_flash_omni.tiny import make_tiny_ming_flash_omni
from omnistage.models.generation import GenerationItem
from omnistage.models.registry import auto_config
from omnistage.pipeline.omni import Omni
from omnistage.testing.payload_equality import assert_same_payload
from omnistage.testing.tiny_deploys import tiny_speech_deploy
from tests.pipeline.pipeline_runs import run_recorded

PROMPTS = [
    "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nSay a long sentence about cats<|im_end|>\n<|im_start|>assistant\n",
]
PARAMS = {
    "thinker": SamplingParams(temperature=0.8, seed=100, max_tokens=8),
    "talker": SamplingParams(temperature=1.0, seed=7, max_tokens=16),
}
EDGE = "talker->audio_vae"
WIDTH = 32  # the tiny talker's patch: 4 frames x 8 latent channels


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_ming_flash_omni(tmp_path_factory.mktemp("ming-flash"), dtype=torch.float64)


def _deploy(ckpt, async_scheduling: bool):
    return tiny_speech_deploy("demo-ming-flash-omni", ckpt, async_scheduling=async_scheduling)


def _run(spec, prompts: list[str]) -> tuple[list, dict]:
    """(per prompt: thinker ids, talker ids, audio), and the audio VAE's payloads, packed."""
    outputs, received = run_recorded(spec, prompts, PARAMS)
    ids = [
        (o.outputs["thinker"].token_ids, o.outputs["talker"].token_ids, np.asarray(o.audio))
        for o in outputs
    ]
    return ids, received


@pytest.fixture(scope="module")
def sync_run(ckpt):
    return _run(_deploy(ckpt, False), PROMPTS)


def test_the_talker_speaks_and_the_vae_decodes_its_latents(ckpt, sync_run):
    ids, received = sync_run
    vae = MingFlashAudioVAE.from_checkpoint(ckpt, auto_config(ckpt), torch.float64)
    for i, (thinker_ids, talker_ids, audio) in enumerate(ids):
        assert 0 < len(thinker_ids) <= 8
        assert 5 <= len(talker_ids) <= 16  # never stops before its fifth patch
        assert talker_ids[:-1] == [0] * (len(talker_ids) - 1)
        chunks = [unpack_payload(received[k]) for k in sorted(k for k in received if k[0] == i)]
        assert len(chunks) > 1  # streamed: the first patch goes out before the talker ends
        assert [bool(c.get("meta.finished")) for c in chunks] == [False] * (len(chunks) - 1) + [
            True
        ]
        latents = torch.cat([c["latents.output"] for c in chunks])
        assert (
            latents.shape == (len(talker_ids), WIDTH) and latents.dtype == torch.float64
        )  # the stage's
        (expected,) = vae.generate([GenerationItem(rows=latents)])
        assert audio.shape == (len(talker_ids) * 4 * 4 * 16,)
        np.testing.assert_allclose(audio, expected.numpy(), rtol=0, atol=1e-7)


def test_the_streamed_edge_speaks_the_whole_payload_s_audio(ckpt, sync_run):
    spec = tiny_speech_deploy("demo-ming-flash-omni", ckpt, async_scheduling=False, stream=False)
    whole, received = _run(spec, PROMPTS)
    assert sorted(received) == [(i, EDGE, 0) for i in range(len(PROMPTS))]  # one payload each
    for (t, k, audio), (t2, k2, whole_audio) in zip(sync_run[0], whole, strict=True):
        assert (t, k) == (t2, k2) and audio.shape == whole_audio.shape
        np.testing.assert_allclose(audio, whole_audio, rtol=0, atol=1e-7)


def test_sync_and_async_give_identical_ids_audio_and_payloads(ckpt, sync_run):
    ids, received = sync_run
    async_ids, async_received = _run(_deploy(ckpt, True), PROMPTS)
    for (t, k, a), (t2, k2, a2) in zip(ids, async_ids, strict=True):
        assert (t, k) == (t2, k2)
        assert a.tobytes() == a2.tobytes()
    assert received.keys() == async_received.keys()
    for key, data in received.items():
        assert_same_payload(async_received[key], data, key)


def test_alone_equals_batched(ckpt, sync_run):
    ids, _ = sync_run
    with Omni(_deploy(ckpt, True), in_process=True) as omni:
        for i, prompt in enumerate(PROMPTS):
            (out,) = omni.generate([prompt], PARAMS)
            assert out.error is None
            assert out.outputs["thinker"].token_ids == ids[i][0]
            assert out.outputs["talker"].token_ids == ids[i][1]
            np.testing.assert_allclose(np.asarray(out.audio), ids[i][2], rtol=0, atol=1e-9)
