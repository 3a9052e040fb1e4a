"""Configs without transformers: `PlainConfig` holds what transformers' config holds, the
cache entry makes a later start import no transformers, `DefaultRope` equals each class's
transformers rotary, and the ggml type table equals gguf's."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import transformers
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from omnistage.families.llama.model import LlamaForCausalLM
from omnistage.layers.ggml_types import BLOCK_SIZES, GGMLType
from omnistage.layers.rotary import DefaultRope
from omnistage.models import registry
from omnistage.models.loader import ModelFiles, load_hf_config
from omnistage.models.plain_config import PlainConfig
from omnistage.models.tiny_checkpoints import make_checkpoint

PLAIN_ARCHS = ["llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"]


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path / "cache"))


def _files(path: Path) -> ModelFiles:
    return ModelFiles(str(path), path, "test")


@pytest.mark.parametrize("arch", PLAIN_ARCHS)
def test_plain_config_has_every_value_and_alias_of_transformers(tmp_path, arch):
    path = make_checkpoint(tmp_path / arch, arch)
    reference = transformers.AutoConfig.from_pretrained(path)
    first = load_hf_config(_files(path))
    again = load_hf_config(_files(path))  # from the cache entry
    for config in (first, again):
        assert isinstance(config, PlainConfig)
        assert config.to_dict() == reference.to_dict()
        for key in reference.to_dict():
            assert getattr(config, key) == getattr(reference, key), key
        for alias in reference.attribute_map:
            assert getattr(config, alias) == getattr(reference, alias), alias
        assert config.get_text_config() is config
        with pytest.raises(AttributeError):
            _ = config.no_such_value
        assert getattr(config, "no_such_value", 7) == 7


def test_a_warm_start_reads_the_config_without_importing_transformers_or_torch(tmp_path):
    path = make_checkpoint(tmp_path / "llama", "llama")
    load_hf_config(_files(path))  # writes the entry
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from omnistage.models.loader import ModelFiles, load_hf_config\n"
        f"p = Path({str(path)!r})\n"
        "c = load_hf_config(ModelFiles(str(p), p, 'test'))\n"
        "print(type(c).__name__, c.hidden_size, 'transformers' in sys.modules, "
        "'torch' in sys.modules, c.dtype)\n"
    )
    env = {**__import__("os").environ}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.split() == ["PlainConfig", "64", "False", "False", "torch.float32"]


def test_an_unreadable_cache_entry_is_rebuilt(tmp_path):
    path = make_checkpoint(tmp_path / "llama", "llama")
    load_hf_config(_files(path))
    [entry] = (tmp_path / "cache" / "configs").glob("*.json")
    entry.write_text('{"format": 1, "values": {"hidden')  # a half-written file
    assert load_hf_config(_files(path)).hidden_size == 64
    assert json.loads(entry.read_text())["values"]["hidden_size"] == 64


def test_a_read_only_cache_still_loads(tmp_path, monkeypatch):
    path = make_checkpoint(tmp_path / "llama", "llama")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(blocker))  # mkdir under a file fails
    assert isinstance(load_hf_config(_files(path)), PlainConfig)


def test_a_changed_config_gets_its_own_entry(tmp_path):
    path = make_checkpoint(tmp_path / "llama", "llama")
    assert load_hf_config(_files(path)).rms_norm_eps == 1e-6
    raw = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**raw, "rms_norm_eps": 1e-5}))
    assert load_hf_config(_files(path)).rms_norm_eps == 1e-5


def test_scaled_rope_and_composite_configs_stay_transformers(tmp_path):
    scaled = make_checkpoint(
        tmp_path / "llama3",
        "llama",
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
    )
    assert isinstance(load_hf_config(_files(scaled)), transformers.LlamaConfig)
    assert not (tmp_path / "cache" / "configs").exists()


def _rope_config(theta: float, head_dim: int | None) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        head_dim=head_dim,
        hidden_size=256,
        num_attention_heads=4,
        max_position_embeddings=512,
    )


@pytest.mark.parametrize("theta,head_dim", [(10000.0, None), (1_000_000.0, 128), (500.0, 32)])
def test_default_rope_equals_every_flagged_class_rotary(theta, head_dim):
    flagged = {
        cls
        for cls in {registry.resolve(ref) for f in registry.families() for ref in f.models.values()}
        if issubclass(cls, LlamaForCausalLM) and cls.llama_default_rope
    }
    assert LlamaForCausalLM in flagged and len(flagged) >= 5
    config = _rope_config(theta, head_dim)
    ours = DefaultRope(config)
    for cls in flagged:
        theirs = cls._hf_rotary(config)
        assert torch.equal(ours.inv_freq, theirs.inv_freq), cls.__name__
        assert ours.attention_scaling == theirs.attention_scaling, cls.__name__


def test_ggml_type_table_equals_gguf():
    assert {int(t): t.name for t in GGMLType} == {int(t): t.name for t in GGMLQuantizationType}
    assert {int(t): v for t, v in BLOCK_SIZES.items()} == {
        int(t): v for t, v in GGML_QUANT_SIZES.items()
    }


@pytest.mark.parametrize("theta,head_dim", [(10000.0, None), (1_000_000.0, 128)])
def test_the_qwen3_omni_code_predictors_plain_rope_is_transformers(theta, head_dim):
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeRotaryEmbedding,
    )

    from omnistage.families.qwen3_omni.model import _predictor_rotary

    config = _rope_config(theta, head_dim)
    ours, theirs = _predictor_rotary(config), Qwen3OmniMoeRotaryEmbedding(config)
    assert isinstance(ours, DefaultRope)
    assert torch.equal(ours.inv_freq, theirs.inv_freq)
    assert ours.attention_scaling == theirs.attention_scaling
