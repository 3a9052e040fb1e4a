"""Ming-Omni's vocoder (speech BPE decode, flow + HiFT: `families/ming_omni/s3bpe.py`,
`vocoder.py`) against the inclusionAI/Ming reference's `S3BpeTokenizer` and audio
detokenizer on the tiny vocoder files, float32.

The fixture (`tests/fixtures/ming_omni/vocoder_reference.npz`) was written by the
reference itself (`make_vocoder_fixture.py` beside it says how and with which
stand-ins) on `write_tiny_vocoder(dir, seed=0)`; both sides draw the same noise (the
reference from the global RNG seeded per case, we from a generator with that seed).
Tolerance: 3e-4 absolute on samples of amplitude up to ~0.5 (measured: at most 9e-5;
float32 through 8 Euler steps of the U-Net, each twice for guidance, then HiFT's STFT /
iSTFT; ours sums in another order in a few places).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.families.ming_omni.vocoder import MingVocoder
from omnistage.families.ming_omni.vocoder_tiny import write_tiny_vocoder

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ming_omni" / "vocoder_reference.npz"


@pytest.fixture(scope="module")
def fixture():
    with np.load(FIXTURE) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def vocoder(tmp_path_factory):
    talker = tmp_path_factory.mktemp("ming-vocoder")
    write_tiny_vocoder(talker, seed=0)
    return MingVocoder(talker, torch.float32)


def _cases(fixture) -> list[int]:
    return sorted(int(k.rsplit("_", 1)[1]) for k in fixture if k.startswith("tokens_"))


def test_audio_matches_the_reference_detokenizer(vocoder, fixture):
    assert len(_cases(fixture)) == 3
    for i in _cases(fixture):
        expected = fixture[f"audio_{i}"]
        audio = vocoder.token2wav(
            torch.from_numpy(fixture[f"tokens_{i}"]),
            torch.from_numpy(fixture[f"xvector_{i}"]),
            int(fixture[f"seed_{i}"]),
        ).numpy()
        assert audio.shape == expected.shape
        assert np.abs(expected).max() > 1e-3, "the reference audio is silent: a useless fixture"
        np.testing.assert_allclose(audio, expected, atol=3e-4, rtol=0)


def test_speech_bpe_decodes_as_the_reference(tmp_path, fixture):
    from omnistage.families.ming_omni.s3bpe import S3Bpe
    from omnistage.families.ming_omni.vocoder_tiny import write_tiny_bpe

    write_tiny_bpe(tmp_path)
    bpe = S3Bpe(tmp_path)
    for i in _cases(fixture):
        codes = bpe.decode(fixture[f"bpe_{i}"].tolist())
        assert codes == fixture[f"tokens_{i}"].tolist()
        assert len(codes) > len(fixture[f"bpe_{i}"])  # merges were decoded
    with pytest.raises(ValueError, match="speech BPE id 64"):
        bpe.decode([1, 64])


def test_another_seed_gives_other_audio(vocoder, fixture):
    tokens = torch.from_numpy(fixture["tokens_0"])
    xvector = torch.from_numpy(fixture["xvector_0"])
    a = vocoder.token2wav(tokens, xvector, 1)
    b = vocoder.token2wav(tokens, xvector, 2)
    assert a.shape == b.shape and not torch.equal(a, b)
    assert torch.equal(a, vocoder.token2wav(tokens, xvector, 1))


def test_bad_tokens_are_a_value_error(vocoder):
    xvector = torch.zeros(vocoder.xvector_dim)
    with pytest.raises(ValueError, match="speech tokens"):
        vocoder.token2wav(torch.tensor([vocoder.speech_vocab]), xvector, 0)
    with pytest.raises(ValueError, match="speech tokens"):
        vocoder.token2wav(torch.tensor([], dtype=torch.long), xvector, 0)


def test_the_config_refuses_what_is_not_ported_by_name(tmp_path):
    from omnistage.families.ming_omni.vocoder_config import load_detokenizer_config
    from omnistage.families.ming_omni.vocoder_tiny import TINY_YAML

    with pytest.raises(ValueError, match="audio_detokenizer.yaml is missing"):
        load_detokenizer_config(tmp_path)
    text = TINY_YAML.replace("use_cnn_module: False", "use_cnn_module: True")
    (tmp_path / "audio_detokenizer.yaml").write_text(text)
    with pytest.raises(ValueError, match="flow.encoder.use_cnn_module"):
        load_detokenizer_config(tmp_path)
    refs = "sample_rate: 16000\n" + TINY_YAML.replace(
        "sampling_rate: 22050", "sampling_rate: !ref <sample_rate>"
    )
    (tmp_path / "audio_detokenizer.yaml").write_text(refs)
    assert load_detokenizer_config(tmp_path)[1].sampling_rate == 16000
