"""The CosyVoice3 checkpoint layout (HyperPyYAML + PyTorch state dicts) read as omnistage
reads every checkpoint: converted once into a cached HF view, found again afterwards; a
folder missing a file is a ValueError naming it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from omnistage.families.cosyvoice3.layout import flow_settings, hift_settings, read_yaml
from omnistage.families.cosyvoice3.tiny import make_tiny_cosyvoice3
from omnistage.models.loader import resolve_model
from omnistage.models.registry import auto_config

REAL_YAML_FLOW = {"dit_dim": 1024, "dit_depth": 22, "static_chunk_size": 50}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_tiny_cosyvoice3(tmp_path_factory.mktemp("cv3") / "tiny")


def test_the_yaml_reads_as_data_with_refs_resolved(tmp_path):
    (tmp_path / "c.yaml").write_text(
        "chunk_size: 25\nratio: 2\nflow: !new:x.Flow\n"
        "    size: !ref <chunk_size>\n    chunk: !ref <chunk_size> * <ratio>\n"
        "seed: !apply:random.seed [1]\n"
    )
    config = read_yaml(tmp_path / "c.yaml")
    assert config["flow"] == {"size": 25, "chunk": 50}
    (tmp_path / "bad.yaml").write_text("a: !ref <x> + 1\n")
    with pytest.raises(ValueError, match="cannot resolve"):
        read_yaml(tmp_path / "bad.yaml")


def test_the_tiny_checkpoint_converts_once_and_keeps_its_sizes(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path / "cache"))
    view = resolve_model(str(checkpoint)).path
    assert (view / "config.json").is_file() and view != checkpoint
    config = auto_config(view)
    assert config.model_type == "cosyvoice3"
    assert config.llm_config.vocab_size == 6561 + 200 and not config.llm_config.tie_word_embeddings
    yaml_config = read_yaml(checkpoint / "cosyvoice3.yaml")
    assert config.flow_config == flow_settings(yaml_config)
    assert config.hift_config["upsample_rates"] == list(
        hift_settings(yaml_config)["upsample_rates"]
    )
    mtime = (view / "model.safetensors").stat().st_mtime_ns
    assert resolve_model(str(checkpoint)).path == view  # found, not converted again
    assert (view / "model.safetensors").stat().st_mtime_ns == mtime
    assert sorted(torch.load(view / "voices.pt", weights_only=True)) == ["bright", "demo"]


def test_a_folder_missing_a_part_is_a_value_error_naming_it(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path / "cache"))
    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    (broken / "hift.pt").unlink()
    with pytest.raises(ValueError, match="hift.pt is missing"):
        resolve_model(str(broken))
