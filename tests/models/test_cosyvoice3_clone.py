"""CosyVoice3's clone front end (`clone.py`, `clone_features.py`) against the reference.

`fixtures/cosyvoice3/clone.pt` holds what FunAudioLLM/CosyVoice's `CosyVoiceFrontEnd`
computes for a fixed 2 s clip on the tiny demo's `speech_tokenizer_v3.onnx` and
`campplus.onnx` (`make_clone_fixture.py`): our resampled clip, whisper log-mel, Kaldi fbank and prompt
mel equal its within 1e-6 (float32), the speech tokens are identical, the x-vector is
within 1e-5 (0.0 measured for all: `docs/tts.md`). An upload becomes a voice (zero-shot with its
transcript, cross-lingual without), a deleted one is refused naming `voice`, and a
checkpoint without the ONNX files says which file it lacks.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from omnistage.families.cosyvoice3 import clone, tiny_onnx
from omnistage.families.cosyvoice3 import clone_features as cf
from omnistage.multimodal.media import resample_audio
from omnistage.voice_store import VoiceStore

FIXTURE = Path(__file__).parents[1] / "fixtures" / "cosyvoice3" / "clone.pt"


@pytest.fixture(scope="module")
def reference() -> dict:
    return torch.load(FIXTURE, weights_only=True)


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory) -> Path:
    """The demo's two ONNX files (`make_tiny_cosyvoice3` with seed 0 uses seeds 5, 6)."""
    folder = tmp_path_factory.mktemp("onnx")
    tiny_onnx.make_speech_tokenizer(folder / clone.SPEECH_TOKENIZER, 5)
    tiny_onnx.make_campplus(folder / clone.CAMPPLUS, 6)
    return folder


def test_features_equal_the_reference_front_end(reference: dict) -> None:
    clip24, clip16 = reference["clip24"], reference["clip16"]
    ours16 = resample_audio(clip24.numpy(), 24000, 16000)
    np.testing.assert_allclose(ours16, clip16.numpy(), rtol=0, atol=1e-6)
    mel = cf.whisper_log_mel(clip16)
    assert mel.shape == reference["whisper_mel"].shape
    torch.testing.assert_close(mel, reference["whisper_mel"], rtol=0, atol=1e-6)
    fbank = cf.kaldi_fbank(clip16)
    assert fbank.shape == reference["fbank"].shape
    torch.testing.assert_close(fbank, reference["fbank"], rtol=0, atol=1e-6)
    feat = cf.prompt_mel(clip24)
    assert feat.shape == reference["speech_feat"].shape
    torch.testing.assert_close(feat, reference["speech_feat"], rtol=0, atol=1e-6)


def test_tokens_and_x_vector_equal_the_reference(reference: dict, onnx_dir: Path) -> None:
    tokens = clone.speech_tokens(onnx_dir, reference["clip16"])
    assert tokens.tolist() == reference["speech_tokens"].tolist()
    assert len(set(tokens.tolist())) > 5  # the tiny tokenizer does not collapse
    embedding = clone.speaker_embedding(onnx_dir, reference["clip16"])
    assert embedding.shape == (192,)
    torch.testing.assert_close(embedding, reference["embedding"], rtol=0, atol=1e-5)
    tokens, feat, _ = clone.clip_features(onnx_dir, reference["clip24"].numpy())
    assert feat.shape == (2 * tokens.shape[0], 80)


def _wav(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, 24000, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


def test_an_upload_becomes_a_voice(reference: dict, onnx_dir: Path, monkeypatch) -> None:
    from omnistage.families.cosyvoice3 import voices

    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(onnx_dir / "cache"))
    monkeypatch.setattr(clone, "_tokenizer", lambda path: lambda texts: {"input_ids": [[1, 2]]})
    store = VoiceStore.for_model(onnx_dir)
    clip24 = reference["clip24"].numpy()
    with_text = store.add(_wav(clip24), "A hum.")
    without = store.add(_wav(clip24))
    voice = voices.voice(onnx_dir, with_text["id"])
    assert voice.lm_speech and voice.prompt_text == (1, 2)
    assert voice.speech_tokens.shape[0] == 50 and voice.speech_feat.shape == (100, 80)
    torch.testing.assert_close(voice.embedding, reference["embedding"], rtol=0, atol=1e-5)
    assert not voices.voice(onnx_dir, without["id"]).lm_speech
    assert clone.prompt_text("A hum.") == clone.SYSTEM_PROMPT + "A hum."
    assert clone.prompt_text("Be calm.<|endofprompt|>Hi") == "Be calm.<|endofprompt|>Hi"
    store.delete(with_text["id"])
    with pytest.raises(ValueError, match="^voice: no uploaded voice"):
        voices.voice(onnx_dir, with_text["id"])
    (onnx_dir / "bare").mkdir()
    bare = VoiceStore.for_model(onnx_dir / "bare").add(_wav(clip24), "A hum.")
    with pytest.raises(ValueError, match="^voice: .* no speech_tokenizer_v3.onnx"):
        voices.voice(onnx_dir / "bare", bare["id"])


def _convert(src: Path, out: Path) -> None:
    (out / "config.json").write_text((src / "cosyvoice3.yaml").read_text())


def test_uploads_outlive_a_reconversion(tmp_path: Path, monkeypatch) -> None:
    from omnistage.models.layout_cache import cached_layout_view

    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "checkpoint"
    source.mkdir()
    (source / "cosyvoice3.yaml").write_text("a: 1\n")
    first = cached_layout_view(source, _convert)
    (source / "cosyvoice3.yaml").write_text("a: 12\n")  # edited: a new view
    second = cached_layout_view(source, _convert)
    assert first != second
    assert VoiceStore.for_model(first).root == VoiceStore.for_model(second).root
    assert VoiceStore.for_model(second).root == VoiceStore.for_model(source).root
    assert VoiceStore.for_model(tmp_path).root != VoiceStore.for_model(source).root
