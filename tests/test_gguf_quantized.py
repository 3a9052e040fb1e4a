"""GGUF models keep their quantized weights (dtype auto) and run on the quantized kernels:
which layers stay quantized, logits against the dequantized model, equivalences, memory."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from transformers import AutoModelForCausalLM

from omnistage import LLM, SamplingParams, kernels
from omnistage.layers.quant_paths import ACTIVATIONS_ENV
from omnistage.layers.quantized_linear import QuantizedEmbedding, QuantizedLinear
from omnistage.models.gguf_index import read_gguf_index
from omnistage.models.loader import resolve_model
from tests.test_loading import tiny_model, write_gguf

needs_kernels = pytest.mark.skipif(kernels.load_quant() is None, reason="no C compiler")

LAYER_TYPES = {
    "attn_q": Q.Q8_0,
    "attn_k": Q.Q8_0,
    "attn_v": Q.Q8_0,
    "attn_output": Q.Q4_0,
    "ffn_gate": Q.Q4_1,
    "ffn_up": Q.Q4_1,
    "ffn_down": Q.Q8_0,
}
PROMPTS = [[5, 17, 33, 9, 100], list(range(40, 77)), [7] * 3, list(range(200, 219))]


def _types(layers: int, **overrides: Q) -> dict[str, Q]:
    types = {f"blk.{i}.{k}.weight": t for i in range(layers) for k, t in LAYER_TYPES.items()}
    return {"token_embd.weight": Q.Q8_0, **types, **overrides}


@pytest.fixture(scope="module")
def quantized_gguf(tmp_path_factory):
    """A tiny llama (tied embeddings) stored with every matrix quantized."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMNISTAGE_CACHE_DIR", str(cache))
        path = tmp_path_factory.mktemp("gguf") / "tiny-q.gguf"
        write_gguf(path, tiny_model("llama", tied=True), "llama", _types(2))
        resolve_model(str(path))  # convert once, under this cache
        yield path


def _model(llm: LLM) -> torch.nn.Module:
    return llm.engine.core.executor.runner.model


def _last_logits(llm: LLM) -> list[torch.Tensor]:
    out = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(temperature=0, max_tokens=1, logprobs=20),
        use_tqdm=False,
    )
    return [o.outputs[0].logprobs[0] for o in out]


@needs_kernels
def test_auto_keeps_the_files_quantized_weights(quantized_gguf):
    model = _model(LLM(str(quantized_gguf), async_scheduling=False))
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    assert isinstance(model.embed_tokens, QuantizedEmbedding)
    assert model.embed_tokens.ggml_type == Q.Q8_0
    assert isinstance(model.lm_head, QuantizedLinear)  # tied: the embedding's bytes
    assert model.lm_head.blocks.data_ptr() == model.embed_tokens.blocks.data_ptr()
    assert isinstance(attn.qkv_proj, QuantizedLinear) and attn.qkv_proj.ggml_type == Q.Q8_0
    assert attn.o_proj.ggml_type == Q.Q4_0
    assert mlp.gate_proj.ggml_type == Q.Q4_1 and mlp.down_proj.ggml_type == Q.Q8_0
    # a named dtype dequantizes everything, as before
    plain = _model(LLM(str(quantized_gguf), dtype="float32", async_scheduling=False))
    assert not any(isinstance(m, QuantizedLinear) for m in plain.modules())


@needs_kernels
def test_mixed_types_in_a_fused_layer_load_as_floats(tmp_path, monkeypatch):
    """q and k in different formats cannot share one quantized qkv matrix: that layer loads
    dequantized, the rest keeps the file's format; F16 and F32 matrices stay as they are
    stored (the kernels run them as blocks of 32 values)."""
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "mixed.gguf"
    types = _types(2, **{"blk.0.attn_k.weight": Q.Q4_0, "blk.1.ffn_up.weight": Q.F16})
    write_gguf(path, tiny_model("llama", tied=False), "llama", types)
    model = _model(LLM(str(path), async_scheduling=False))
    assert not isinstance(model.layers[0].self_attn.qkv_proj, QuantizedLinear)
    assert isinstance(model.layers[1].self_attn.qkv_proj, QuantizedLinear)
    assert model.layers[1].mlp.up_proj.ggml_type == Q.F16
    assert model.layers[1].mlp.gate_proj.ggml_type == Q.Q4_1
    assert model.lm_head.ggml_type == Q.F32  # "output" stored as F32


@needs_kernels
def test_quantized_logits_match_the_dequantized_model(quantized_gguf, monkeypatch):
    """On the float32 path, per-layer results equal the float32 product with the dequantized
    weights up to summation order, so the last-position log-probs match transformers
    running the dequantized checkpoint closely (the int8 path, which quantizes activations,
    is held to its own tolerance per layer in test_quant_int8.py)."""
    monkeypatch.setenv(ACTIVATIONS_ENV, "float32")
    llm = LLM(str(quantized_gguf), async_scheduling=False)
    files = resolve_model(str(quantized_gguf))
    hf = AutoModelForCausalLM.from_pretrained(files.path, dtype=torch.float32).eval()
    for prompt, top in zip(PROMPTS, _last_logits(llm), strict=True):
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1], -1)
        ids = list(top)
        assert ids[0] == int(ref.argmax())
        got = torch.tensor([top[i].logprob for i in ids])
        torch.testing.assert_close(got, ref[ids], atol=1e-4, rtol=1e-4)


@needs_kernels
def test_quantized_sync_async_batched_and_alone_agree(quantized_gguf):
    """The kernels sum in one order whatever the batch: greedy and seeded tokens are the same
    sync or async, batched or alone, and with n-gram speculation (verification rows)."""
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    params = [
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        if i % 2
        else SamplingParams(temperature=1.0, seed=7 + i, max_tokens=24, ignore_eos=True)
        for i in range(len(prompts))
    ]

    def run(llm: LLM, one_by_one: bool = False) -> list[list[int]]:
        if one_by_one:
            outs = [
                llm.generate([p], [s], use_tqdm=False)[0]
                for p, s in zip(prompts, params, strict=True)
            ]
        else:
            outs = llm.generate(prompts, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    sync = LLM(str(quantized_gguf), async_scheduling=False)
    base = run(sync)
    assert run(sync, one_by_one=True) == base
    assert run(LLM(str(quantized_gguf), async_scheduling=True)) == base
    spec = LLM(
        str(quantized_gguf),
        async_scheduling=False,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3},
    )
    assert run(spec) == base
    assert len(base) == len(PROMPTS)


def test_fast_tensor_index_equals_gguf_reader(quantized_gguf, tmp_path):
    """The header read that skips metadata finds the same tensors and bytes as gguf's."""
    import gguf
    import numpy as np

    index = read_gguf_index(quantized_gguf)
    reader = gguf.GGUFReader(quantized_gguf)
    assert index.architecture == "llama"
    assert [t.name for t in index.tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(index.tensors, reader.tensors, strict=True):
        assert ours.ggml_type == theirs.tensor_type
        assert ours.shape == tuple(int(d) for d in theirs.shape)
        assert np.array_equal(
            ours.data.reshape(-1), np.asarray(theirs.data).view(np.uint8).reshape(-1)
        )
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(quantized_gguf.read_bytes()[:300])
    with pytest.raises(ValueError, match="bad.gguf: not a readable GGUF file"):
        read_gguf_index(bad)
