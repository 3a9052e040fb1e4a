"""MiMo-Audio's ASR task (`asr.py`) on the tiny checkpoint, against the reference's
`asr_sft` path (`fixtures/mimo_audio/asr.json`, made by `make_asr_fixture.py`):

- the ASR prompt with one clip expands to the reference's `get_asr_sft_prompt` layout;
- greedy (float32), its text tokens and transcript equal the reference's exactly;
- an empty instruction is a ValueError naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnistage.families.mimo_audio.asr import asr_prompt, asr_request, asr_sampling, transcript
from omnistage.families.mimo_audio.tiny import make_tiny_mimo_audio, tiny_clip
from omnistage.models.loader import resolve_model
from omnistage.multimodal import load_input_encoder
from omnistage.testing.tiny_deploys import tiny_speech_deploy
from tests.pipeline.test_mimo_audio_pipeline import run

FIXTURE = Path(__file__).parents[1] / "fixtures" / "mimo_audio" / "asr.json"


@pytest.fixture(scope="module")
def case() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, case) -> Path:
    return make_tiny_mimo_audio(tmp_path_factory.mktemp("mimo") / "tiny", case["seed"])


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def test_the_asr_prompt_is_the_reference_layout(checkpoint, case):
    encoder = load_input_encoder(resolve_model(str(checkpoint)).path)
    clip = tiny_clip(case["samples"]).numpy()
    encoded = encoder.encode(asr_prompt(case["instruction"]), [(clip, case["rate"])])
    assert encoded.prompt_token_ids == case["prompt_token_ids"]
    with pytest.raises(ValueError, match="instruction"):
        asr_prompt(" ")


def test_greedy_transcript_equals_the_reference(checkpoint, case):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model(str(checkpoint)).path)
    params = asr_sampling(tok, max_tokens=case["max_new_tokens"])
    assert params.stop_token_ids == case["stop_token_ids"] and params.temperature == 0.0
    spec = tiny_speech_deploy("demo-mimo-audio", checkpoint, dtype="float32")
    prompt = asr_request((tiny_clip(case["samples"]).numpy(), case["rate"]))
    (out,), _ = run(spec, [prompt], params)
    assert out.token_ids == case["tokens"]
    assert transcript(tok, out.token_ids) == case["transcript"] != ""
