"""GGUF files whose matrices are stored as F32, F16 or BF16 keep that format (dtype auto):
the quantized kernels run them as blocks of 32 values without a scale, so the decode
program takes them, resident weights stay the file's size (an F16 file is not widened to
float32), and every equivalence of the quantized formats holds for them too."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from transformers import AutoModelForCausalLM

from omnistage import LLM, SamplingParams, kernels
from omnistage.layers.decode_program import DISABLE_ENV
from omnistage.layers.ggml_types import GGMLType
from omnistage.layers.quant_paths import ACTIVATIONS_ENV
from omnistage.layers.quantized_linear import QuantizedEmbedding, QuantizedLinear
from omnistage.models.gguf_index import read_gguf_index
from omnistage.models.loader import resolve_model
from tests.test_loading import tiny_model, write_gguf

needs_kernels = pytest.mark.skipif(
    kernels.load() is None or kernels.load_quant() is None, reason="no C compiler"
)

PROMPTS = [[5, 17, 33, 9, 100], list(range(40, 77)), [7] * 3, list(range(200, 219))]
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _write(path, ggml_type: Q, **overrides) -> None:
    types = {f"blk.{i}.{m}.weight": ggml_type for i in range(2) for m in MATRICES}
    model = tiny_model("llama", tied=True, **overrides)
    write_gguf(path, model, "llama", {"token_embd.weight": ggml_type, **types})


@pytest.fixture(scope="module", params=[Q.F32, Q.F16, Q.BF16], ids=lambda t: t.name)
def float_gguf(request, tmp_path_factory):
    """A tiny llama (tied embeddings) with every matrix stored as one float type."""
    cache = tmp_path_factory.mktemp("cache")
    path = tmp_path_factory.mktemp("gguf") / f"tiny-{request.param.name}.gguf"
    _write(path, request.param)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMNISTAGE_CACHE_DIR", str(cache))
        resolve_model(str(path))
        yield path, request.param


def _model(llm: LLM) -> torch.nn.Module:
    return llm.engine.core.executor.runner.model


def _run(llm: LLM, params: SamplingParams | None = None) -> list[tuple[list[int], list]]:
    params = params or SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [
        (
            list(o.outputs[0].token_ids),
            [{k: v.logprob for k, v in step.items()} for step in o.outputs[0].logprobs or []],
        )
        for o in outs
    ]


@needs_kernels
def test_float_matrices_keep_the_files_format(float_gguf):
    path, ggml_type = float_gguf
    model = _model(LLM(str(path), async_scheduling=False))
    kept = [m for m in model.modules() if isinstance(m, QuantizedLinear | QuantizedEmbedding)]
    assert {m.ggml_type for m in kept} == {GGMLType(ggml_type)}
    assert isinstance(model.embed_tokens, QuantizedEmbedding)
    assert model.lm_head.blocks.data_ptr() == model.embed_tokens.blocks.data_ptr()
    assert len(kept) == 2 + 2 * 5  # the embedding, the head on its bytes; qkv, o, gate, up, down
    # resident: the file's bytes of those matrices, nothing widened
    index = read_gguf_index(path)
    stored = sum(t.data.nbytes for t in index.tensors if len(t.shape) == 2)
    resident = {m.blocks.data_ptr(): m.blocks.nbytes for m in kept}
    assert sum(resident.values()) == stored
    plain = _model(LLM(str(path), dtype="float32", async_scheduling=False))
    assert not any(isinstance(m, QuantizedLinear) for m in plain.modules())


@needs_kernels
def test_logits_match_transformers_on_the_same_weights(float_gguf):
    """The kernels sum in another order than transformers: log-probs within 1e-4."""
    path, _ = float_gguf
    llm = LLM(str(path), async_scheduling=False)
    hf = AutoModelForCausalLM.from_pretrained(resolve_model(str(path)).path, dtype=torch.float32)
    one = SamplingParams(temperature=0, max_tokens=1, logprobs=20)
    for prompt, (tokens, steps) in zip(PROMPTS, _run(llm, one), strict=True):
        with torch.no_grad():
            ref = torch.log_softmax(hf.eval()(torch.tensor([prompt])).logits[0, -1], -1)
        assert tokens[0] == int(ref.argmax())
        ids = list(steps[0])
        got = torch.tensor([steps[0][i] for i in ids])
        torch.testing.assert_close(got, ref[ids], atol=1e-4, rtol=1e-4)


@needs_kernels
def test_the_decode_program_runs_float_files_bit_for_bit(float_gguf, monkeypatch):
    """Decode steps run as one C call on float matrices too, equal to the layer path; asking
    for int8 activations leaves float matrices on the float path."""
    path, _ = float_gguf
    monkeypatch.setenv(ACTIVATIONS_ENV, "int8")
    llm = LLM(str(path), async_scheduling=False)
    programmed = _run(llm)
    assert _model(llm)._program is not None and _model(llm)._program.steps_run >= 11
    layers = [m for m in _model(llm).modules() if isinstance(m, QuantizedLinear)]
    assert {m.activations for m in layers} == {"float32"}
    layers[0].activations = "int8"  # asked for by hand too: float matrices have no int8 path
    assert layers[0].activations == "float32"
    monkeypatch.setenv(DISABLE_ENV, "1")
    layered = LLM(str(path), async_scheduling=False)
    assert _run(layered) == programmed
    assert _model(layered)._program is None


@needs_kernels
def test_sync_async_speculative_and_alone_agree(float_gguf):
    """On F16 (the three types share every kernel but the unpacking of a block, whose batch
    invariance `test_quantized_linear.py` checks per type; each run here starts a worker)."""
    path, ggml_type = float_gguf
    if ggml_type != Q.F16:
        pytest.skip("one float type is enough here")
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    base = [t for t, _ in _run(LLM(str(path), async_scheduling=False), params)]
    assert [t for t, _ in _run(LLM(str(path), async_scheduling=True), params)] == base
    spec = LLM(
        str(path),
        async_scheduling=False,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3},
    )
    assert [t for t, _ in _run(spec, params)] == base
    alone = LLM(str(path), async_scheduling=False)
    for prompt, tokens in zip(PROMPTS, base, strict=True):
        out = alone.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        assert list(out.outputs[0].token_ids) == tokens


@needs_kernels
def test_rows_not_a_multiple_of_32_load_as_floats(tmp_path, monkeypatch):
    """The kernels take float rows in blocks of 32: a matrix whose rows are not (the down
    product of an 80-wide MLP) loads as floats, the others keep the file's format."""
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "odd.gguf"
    _write(path, Q.F16, intermediate_size=80)
    mlp = _model(LLM(str(path), async_scheduling=False)).layers[0].mlp
    assert mlp.gate_proj.ggml_type == GGMLType.F16
    assert not isinstance(mlp.down_proj, QuantizedLinear)
    with pytest.raises(ValueError, match="in_features: 80 is not a multiple of 32"):
        QuantizedLinear(torch.zeros(8 * 80 * 2, dtype=torch.uint8), GGMLType.F16, 80, 8)
