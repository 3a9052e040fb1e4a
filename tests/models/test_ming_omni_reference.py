"""Ming-Omni's thinker and talker against the inclusionAI/Ming reference, on the tiny
checkpoint in float32.

The fixture (`tests/fixtures/ming_omni/reference.npz`) was written by the reference
code itself (`make_reference_fixture.py` beside it says how, and which stand-ins it
needs) on the checkpoint `make_tiny_ming_omni(path, seed=0)` writes; the test rebuilds
that checkpoint and checks its weights' SHA-256 first.

- thinker: greedy ids identical; every step's logits within 1e-4 (float32: the
  reference scales q before q k^T and sums experts in another order);
- talker: fed through the demo-ming-omni pipeline (thinker -> payload -> edge ->
  talker), its greedy speech ids equal the reference's `omni_tts_binary_generation`
  ids (which are the talker's ids minus the talker tokenizer's 270 text ids).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage import LLM, SamplingParams
from omnistage.families.ming_omni.tiny import make_tiny_ming_omni
from omnistage.pipeline.omni import Omni
from omnistage.testing.tiny_deploys import tiny_speech_deploy

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ming_omni" / "reference.npz"
TEXT_VOCAB = 270


@pytest.fixture(scope="module")
def fixture():
    with np.load(FIXTURE) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, fixture):
    path = make_tiny_ming_omni(tmp_path_factory.mktemp("ming-ref"), seed=0)
    meta = json.loads(str(fixture["meta"]))
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    assert digest == meta["weights_sha256"], "the tiny checkpoint is not the fixture's"
    return path


def _cases(fixture) -> list[int]:
    return sorted(int(k.rsplit("_", 1)[1]) for k in fixture if k.startswith("prompt_ids_"))


def test_thinker_greedy_ids_and_logits_match_the_reference(ckpt, fixture):
    llm = LLM(str(ckpt), model_part="thinker", dtype="float32", async_scheduling=False)
    runner = llm.engine.core.executor.runner
    for i in _cases(fixture):
        seen: list[torch.Tensor] = []
        runner.add_sample_observer(lambda event, seen=seen: seen.append(event.logits[0]))
        expected = fixture[f"thinker_ids_{i}"].tolist()
        (out,) = llm.generate(
            [{"prompt_token_ids": fixture[f"prompt_ids_{i}"].tolist()}],
            SamplingParams(temperature=0, max_tokens=len(expected)),
            use_tqdm=False,
        )
        assert out.outputs[0].token_ids == expected
        ours = torch.stack(seen[-len(expected) :]).float()
        ref = torch.from_numpy(fixture[f"thinker_logits_{i}"])
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


def test_talker_greedy_speech_ids_match_the_reference(ckpt, fixture):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    spec = tiny_speech_deploy("demo-ming-omni", ckpt, dtype="float32", async_scheduling=False)
    cases = _cases(fixture)
    steps = json.loads(str(fixture["meta"]))["talker_steps"]
    prompts = [tok.decode(fixture[f"prompt_ids_{i}"].tolist()) for i in cases]
    params = {
        "thinker": SamplingParams(temperature=0, max_tokens=len(fixture["thinker_ids_0"])),
        "talker": SamplingParams(temperature=0, max_tokens=steps),
    }
    with Omni(spec, in_process=True) as omni:
        outs = omni.generate(prompts, params)
    for i, out in zip(cases, outs, strict=True):
        assert out.error is None, out.error
        assert out.outputs["thinker"].token_ids == fixture[f"thinker_ids_{i}"].tolist()
        speech = [t - TEXT_VOCAB for t in out.outputs["talker"].token_ids]
        assert speech == fixture[f"talker_ids_{i}"].tolist()
