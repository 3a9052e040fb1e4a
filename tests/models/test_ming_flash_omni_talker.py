"""Ming-flash-omni-2.0's talker stage (`talker.py`) and audio VAE decoder (`audio_vae.py`)
on the tiny checkpoint's talker.

- Parity (float32): the prompt ids, the stop step and every latent patch of two seeded
  requests (temperature 0 and 1.5) equal inclusionAI/Ming-omni-tts's `sample` loop on the
  same weights (`fixtures/ming_flash_omni/talker_reference.npz`, `make_talker_fixture.py`;
  transformers 4.52.4, the version the reference pins), and the decoder's waveform of
  those patches equals the reference decoder's, whole and streamed.
- The float rows fed back (float64): sync = async bit for bit (whole and chunked
  prefill); alone = batched, chunked prefill = whole prefill, and a request preempted
  (recomputed) gets its patches back: the stop steps exactly, the patches to float64
  rounding (1e-12; measured 3e-15: other batch shapes run other GEMM blockings).
- A patch's random stream is a function of (seed, position): replayed from the seed it
  is the stream kept from the step before.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.engine.llm_engine import LLMEngine
from omnistage.families.ming_flash_omni.audio_vae import MingFlashAudioVAE
from omnistage.families.ming_flash_omni.flow_head import FlowHead
from omnistage.families.ming_flash_omni.talker_heads import TINY
from omnistage.families.ming_flash_omni.talker_prompt import talker_prompt_ids
from omnistage.families.ming_flash_omni.tiny import make_tiny_ming_flash_omni
from omnistage.models.generation import GenerationItem
from omnistage.models.registry import auto_config

FIXTURE = Path(__file__).parents[1] / "fixtures" / "ming_flash_omni" / "talker_reference.npz"
TEXTS = ["The end is near.", "A second line.", "Say a long sentence about cats", "Why?"]
WIDTH = TINY.patch_size * TINY.latent_dim


@pytest.fixture(scope="module")
def fixture():
    return np.load(FIXTURE)


@pytest.fixture(scope="module")
def ckpt32(tmp_path_factory):
    return make_tiny_ming_flash_omni(tmp_path_factory.mktemp("mf-talker32"), seed=0)


@pytest.fixture(scope="module")
def ckpt64(tmp_path_factory):
    path = tmp_path_factory.mktemp("mf-talker64")
    return make_tiny_ming_flash_omni(path, seed=0, dtype=torch.float64)


def _tokenizer(ckpt: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ckpt)


def _engine(ckpt: Path, dtype: str = "float64", **engine_args) -> LLMEngine:
    engine_args.setdefault("executor_backend", "thread")  # no worker process to start
    return LLMEngine(EngineConfig(model=str(ckpt), model_part="talker", dtype=dtype, **engine_args))


def _run(eng: LLMEngine, requests: dict) -> dict[str, torch.Tensor]:
    """Per request: its rows [steps, 1 + width] (stop token, then its patch)."""
    rows: dict[str, list] = {}
    eng.core_output_listener = lambda rid, out: rows.setdefault(rid, []).extend(
        [t, *c] for t, c in zip(out.new_token_ids, out.new_codes or [], strict=True)
    )
    for rid, (ids, params) in requests.items():
        eng.add_tokenized_request(rid, None, ids, params)
    while eng.has_unfinished_requests():
        eng.step()
    return {r: torch.tensor(v, dtype=torch.float64) for r, v in rows.items()}


def test_prompt_stop_step_and_patches_match_the_reference(ckpt32, fixture):
    meta = json.loads(str(fixture["meta"]))
    digest = hashlib.sha256((ckpt32 / "talker.safetensors").read_bytes()).hexdigest()
    assert digest == meta["weights_sha256"]  # the fixture's weights are this checkpoint's
    tok = _tokenizer(ckpt32)
    requests = {}
    for name, (text, seed, temperature) in meta["cases"].items():
        ids = talker_prompt_ids(tok, text, meta["prompt"])
        assert ids == fixture[f"{name}_prompt_ids"].tolist()
        params = SamplingParams(temperature=temperature, seed=seed, max_tokens=meta["steps"])
        requests[name] = (ids, params)
    got = _run(_engine(ckpt32, "float32"), requests)
    for name in requests:
        expected = torch.from_numpy(fixture[f"{name}_patches"]).double()
        steps = expected.shape[0] // TINY.patch_size
        assert bool(fixture[f"{name}_stopped"])
        assert got[name][:, 0].tolist() == [0.0] * (steps - 1) + [1.0]  # stops where it stops
        patches = got[name][:, 1:].reshape(-1, TINY.latent_dim)
        torch.testing.assert_close(patches, expected, rtol=0, atol=1e-5)


def test_audio_vae_decodes_the_reference_waveform(ckpt32, fixture):
    vae = MingFlashAudioVAE.from_checkpoint(ckpt32, auto_config(ckpt32), torch.float32)
    for name in ("greedy", "warm"):
        patches = torch.from_numpy(fixture[f"{name}_patches"]).reshape(-1, WIDTH)
        (wav,) = vae.generate([GenerationItem(rows=patches.double())])
        for key in ("wav", "wav_streamed"):
            expected = torch.from_numpy(fixture[f"{name}_{key}"])
            torch.testing.assert_close(wav, expected, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="latents.output"):
        vae.check_item(GenerationItem(rows=torch.zeros(3, WIDTH + 1)))


def _requests(ckpt: Path, max_tokens: int = 14) -> dict:
    tok = _tokenizer(ckpt)
    return {
        f"r{i}": (
            talker_prompt_ids(tok, text),
            SamplingParams(temperature=1.5 * (i % 2), seed=40 + i, max_tokens=max_tokens),
        )
        for i, text in enumerate(TEXTS)
    }


def _same(a: dict, b: dict, atol: float = 0.0) -> None:
    """Equal stop steps; patches bit for bit, or within `atol`."""
    assert a.keys() == b.keys()
    for rid in a:
        assert a[rid][:, 0].tolist() == b[rid][:, 0].tolist(), rid
        torch.testing.assert_close(a[rid], b[rid], rtol=0, atol=atol, msg=rid)


def test_float64_sync_async_batched_alone_chunked_equal(ckpt64):
    requests = _requests(ckpt64)
    sync = _run(_engine(ckpt64), requests)
    assert len({len(v) for v in sync.values()}) > 1  # requests stop at different steps
    eng = _engine(ckpt64, async_scheduling=True)
    _same(_run(eng, requests), sync)
    alone = {}
    for rid, request in requests.items():
        alone.update(_run(eng, {rid: request}))
    _same(alone, sync, atol=1e-12)
    chunked = _run(_engine(ckpt64, max_num_batched_tokens=48), requests)
    _same(chunked, sync, atol=1e-12)
    chunked_async = _engine(ckpt64, async_scheduling=True, max_num_batched_tokens=48)
    _same(_run(chunked_async, requests), chunked)


def test_preempted_requests_get_their_patches_again(ckpt64):
    requests = dict(list(_requests(ckpt64, max_tokens=20).items())[:3])
    requests = {r: (ids, p.clone(ignore_eos=True)) for r, (ids, p) in requests.items()}
    expected = _run(_engine(ckpt64, enable_prefix_caching=False), requests)
    for async_scheduling in (False, True):
        eng = _engine(
            ckpt64,
            async_scheduling=async_scheduling,
            enable_prefix_caching=False,
            num_kv_blocks=24,
            block_size=16,
            max_model_len=256,
            max_num_batched_tokens=64,
        )
        got = _run(eng, requests)
        assert eng.core.scheduler.num_preemptions > 0
        _same(got, expected, atol=1e-12)


def test_a_patch_stream_is_a_function_of_seed_and_position(ckpt32):
    from omnistage.families.ming_flash_omni.dit import DiT

    head = FlowHead(DiT(TINY.latent_dim, TINY.llm_hidden_size, 16, 1, 2), 8, 4)
    ran, skipped = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    cond, history = torch.randn(1, 1, TINY.llm_hidden_size), torch.zeros(1, 8, 8)
    head.sample(cond, history, ran, temperature=1.0)
    head.skip_patch(skipped)
    assert torch.equal(ran.get_state(), skipped.get_state())


def test_empty_text_is_a_value_error_naming_the_input(ckpt32):
    with pytest.raises(ValueError, match="input"):
        talker_prompt_ids(_tokenizer(ckpt32), "  ")


def test_bad_talker_settings_are_value_errors_naming_the_field():
    from omnistage.families.ming_flash_omni.audio_vae import TINY_VAE, AudioVAEDecoder
    from omnistage.families.ming_flash_omni.talker_config import MingFlashTalkerConfig

    with pytest.raises(ValueError, match="talker_config.sigma"):
        MingFlashTalkerConfig(sigma=-1.0)
    with pytest.raises(ValueError, match="talker_config.patch_size"):
        _ = MingFlashTalkerConfig(patch_size=0).heads
    vae = {k: v for k, v in TINY_VAE.items() if k != "hop_length"}
    with pytest.raises(ValueError, match="talker_config.audio_vae.hop_length"):
        AudioVAEDecoder(vae, torch.float32)
