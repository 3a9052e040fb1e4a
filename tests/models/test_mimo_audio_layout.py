"""A MiMo-Audio checkpoint as the Hub publishes it (`model_type: qwen2`, architectures
`MiMoAudioModel`, no `<|empty|>` id in config.json, sharded weights, the audio tokenizer
a separate folder) picks the MiMo-Audio deploy and loads through its view, without a
change to the user's files."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from omnistage.families.mimo_audio.tiny import EMPTY_ID, make_tiny_mimo_audio
from omnistage.models import registry
from omnistage.models.loader import load_hf_config, resolve_model
from omnistage.pipeline.deploy import deploy_for_model, model_type_of

PUBLISHED_FILES = {
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "audio_tokenizer/config.json",
    "audio_tokenizer/model.safetensors",
}


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    return make_tiny_mimo_audio(tmp_path_factory.mktemp("hub") / "MiMo-Audio-7B-Instruct")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path / "cache"))


def test_tiny_checkpoint_is_written_as_published(published) -> None:
    files = {str(p.relative_to(published)) for p in published.rglob("*") if p.is_file()}
    assert files >= PUBLISHED_FILES
    config = json.loads((published / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert config["architectures"] == ["MiMoAudioModel"]
    assert "empty_token_id" not in config
    index = json.loads((published / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }


def test_published_folder_picks_the_mimo_deploy_and_is_left_untouched(published) -> None:
    before = _digest(published)
    spec = deploy_for_model(str(published))
    assert spec.name == "mimo-audio"
    assert [s.name for s in spec.stages] == ["lm", "code2wav"]
    view = resolve_model(str(published)).path
    assert view != published
    config = json.loads((view / "config.json").read_text())
    assert config["model_type"] == "mimo_audio"
    assert config["empty_token_id"] == EMPTY_ID
    assert load_hf_config(resolve_model(str(published))).empty_token_id == EMPTY_ID
    assert (view / "audio_tokenizer" / "model.safetensors").is_file()
    model_type_of.cache_clear()
    assert model_type_of(str(published)) == "mimo_audio"
    assert registry.layout_converter(view) is None  # the view is not converted again
    assert _digest(published) == before


def test_audio_tokenizer_beside_the_checkpoint(published, tmp_path) -> None:
    lm = tmp_path / "models" / "MiMo-Audio-7B-Instruct"
    shutil.copytree(published, lm, ignore=shutil.ignore_patterns("audio_tokenizer"))
    with pytest.raises(ValueError, match="audio tokenizer.*MiMo-Audio-Tokenizer"):
        resolve_model(str(lm))
    shutil.copytree(published / "audio_tokenizer", tmp_path / "models" / "MiMo-Audio-Tokenizer")
    view = resolve_model(str(lm)).path
    assert (view / "audio_tokenizer" / "config.json").read_text() == (
        published / "audio_tokenizer" / "config.json"
    ).read_text()


def test_tokenizer_without_empty_token_is_named(published, tmp_path) -> None:
    lm = tmp_path / "lm"
    shutil.copytree(published, lm)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        text = (lm / name).read_text().replace("<|empty|>", "<|other|>")
        (lm / name).write_text(text)
    with pytest.raises(ValueError, match=r"no <\|empty\|> token"):
        resolve_model(str(lm))


def test_other_qwen2_checkpoints_are_not_claimed(tmp_path) -> None:
    for config in (
        {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]},
        {"model_type": "mimo_audio", "architectures": ["MiMoAudioModel"]},
    ):
        (tmp_path / "config.json").write_text(json.dumps(config))
        assert registry.layout_converter(tmp_path) is None
