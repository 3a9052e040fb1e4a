"""Ming-Omni's audio input against the inclusionAI/Ming reference, on the tiny checkpoint in
float32.

The fixture (`tests/fixtures/ming_omni/audio_reference.npz`) was written by the reference
code (`make_audio_fixture.py` beside it says how: FunASR 1.2.6's `SANMEncoder`,
torchaudio's `compliance/kaldi.py`) on the checkpoint `make_tiny_ming_omni(path, seed=0)`
writes; the test rebuilds it and checks the SHA-256 of its three shards and `am.mvn`
first. Four cases: a clip at `<audio>`, a prompt without `<audio>` (the reference appends
the block), a longer clip mid-sentence, an image and a clip in one prompt (both spans,
both gates).

- the features (our Kaldi fbank, LFR, CMVN; the reference runs torchaudio's
  `kaldi.fbank`): equal to the reference's, bit for bit; and, without the fixture, a
  pure tone's energy lands in the mel bin around its frequency, LFR's padding as stated;
- the expanded prompt ids equal; the audio rows (SANM + projector + normalize) within
  1e-5 (measured 0: bit for bit); the AUDIO span is exactly the reference's placeholder run;
- the thinker with the audio rows and routing: greedy ids identical to the reference's
  `generate` (`use_cache=False`, as its scripts run it), every step's logits within 1e-4 (measured 2.5e-6);
  with the same rows and no modality the logits move by more than 1e-2 (measured 0.24 to 0.6) (the audio gate
  is what is checked).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.families.ming_omni.fbank import apply_lfr, fbank
from omnistage.families.ming_omni.input_encoder import MingInputEncoder
from omnistage.families.ming_omni.thinker import AUDIO, IMAGE
from omnistage.families.ming_omni.tiny import make_tiny_ming_omni
from tests.models.npz_fixture import checked_checkpoint, load_npz
from tests.models.test_ming_omni_image import generate

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ming_omni" / "audio_reference.npz"
PROMPTS = [
    "<|im_start|>user\n<audio>What is said?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nTranscribe, please.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nListen: <audio> and answer.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\n<image>Look, and listen: <audio><|im_end|>\n<|im_start|>assistant\n",
]
CASES = [0, 1, 2, 3]


@pytest.fixture(scope="module")
def fixture():
    return load_npz(FIXTURE)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, fixture):
    return checked_checkpoint(
        make_tiny_ming_omni(tmp_path_factory.mktemp("ming-audio"), seed=0), fixture
    )


@pytest.fixture(scope="module")
def encoder(ckpt):
    return MingInputEncoder.from_checkpoint(ckpt, torch.float32)


@pytest.fixture(scope="module")
def llm(ckpt):
    from omnistage import LLM

    return LLM(str(ckpt), model_part="thinker", dtype="float32", executor_backend="inline")


def clip(fixture, i: int) -> tuple[np.ndarray, int]:
    return fixture[f"wave_{i}"], 16000


def images(fixture, i: int) -> list[np.ndarray]:
    return [fixture[f"image_{i}"]] if f"image_{i}" in fixture else []


@pytest.mark.parametrize("i", CASES)
def test_features_prompt_and_rows_match_the_reference(encoder, fixture, i):
    feats = encoder.audio_features(clip(fixture, i))
    assert torch.equal(feats, torch.from_numpy(fixture[f"features_{i}"]))
    encoded = encoder.encode(PROMPTS[i], [clip(fixture, i)], images(fixture, i))
    assert encoded.prompt_token_ids == fixture[f"prompt_ids_{i}"].tolist()
    (start, length), kinds = fixture[f"loc_lens_{i}"][0, 0], encoded.token_modality
    assert (kinds == AUDIO).nonzero().flatten().tolist() == list(range(start, start + length))
    assert set(kinds.tolist()) == ({0, AUDIO, IMAGE} if images(fixture, i) else {0, AUDIO})
    rows = encoded.prompt_embeds[kinds == AUDIO]
    torch.testing.assert_close(rows, torch.from_numpy(fixture[f"rows_{i}"]), rtol=0, atol=1e-5)
    ids = encoder.tokenizer(PROMPTS[i], add_special_tokens=False).input_ids
    again = encoder.encode(ids, [clip(fixture, i)], images(fixture, i))
    assert again.prompt_token_ids == encoded.prompt_token_ids


def test_fbank_equals_kaldi_formulas_on_a_known_tone():
    """Independent of the fixture: a pure tone's energy lands in the mel bin holding it."""
    rate, hz = 16000, 1000.0
    wave = torch.sin(2 * torch.pi * hz * torch.arange(rate) / rate) * 2**14
    mat = fbank(wave, 40)
    assert mat.shape == (98, 40)  # 1 + (16000 - 400) // 160
    peak = int(mat.mean(0).argmax())
    mel = lambda f: 1127.0 * np.log(1 + f / 700.0)  # noqa: E731
    edges = mel(20.0) + (mel(8000.0) - mel(20.0)) / 41 * np.arange(42)
    assert edges[peak] < mel(hz) < edges[peak + 2]
    stacked = apply_lfr(mat, 7, 6)
    assert stacked.shape == (17, 280)
    assert torch.equal(stacked[0, :120], mat[0].repeat(3))  # (7 - 1) // 2 copies in front
    assert torch.equal(stacked[-1, -40:], mat[-1])


@pytest.mark.parametrize("i", CASES)
def test_thinker_with_audio_matches_the_reference(encoder, llm, fixture, i):
    encoded = encoder.encode(PROMPTS[i], [clip(fixture, i)], images(fixture, i))
    ids, logits = generate(llm, lambda eng, p: eng.add_encoded_request(f"aud{i}", encoded, p))
    assert ids == fixture[f"ids_{i}"].tolist()
    ref = torch.from_numpy(fixture[f"logits_{i}"])
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
    if i == 0:  # the same rows routed through `gate`: other logits
        rows, prompt = encoded.prompt_embeds, list(encoded.prompt_token_ids)
        _, unrouted = generate(
            llm, lambda eng, p: eng.add_tokenized_request("plain", None, prompt, p, rows)
        )
        assert (unrouted[0] - ref[0]).abs().max() > 1e-2


def test_bad_audio_input_is_a_value_error_naming_it(encoder, fixture):
    one = clip(fixture, 0)
    with pytest.raises(ValueError, match="audio: 2 clips"):
        encoder.encode(PROMPTS[0], [one, one])
    with pytest.raises(ValueError, match="audio: the prompt has 2 <audio> placeholders"):
        encoder.encode("<audio><audio>", [one])
    with pytest.raises(ValueError, match="audio: "):
        encoder.encode(PROMPTS[0], [(np.zeros(100, dtype=np.float32), 16000)])
    with pytest.raises(ValueError, match="audio: "):
        encoder.encode(PROMPTS[0], [b"not audio"])
