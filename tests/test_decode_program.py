"""The decode program (layers/decode_program.py, kernels/decode_program.c): steps of decodes
run the layers in one C call, bit for bit what the layer-by-layer forward computes."""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants

from omnistage import LLM, SamplingParams, kernels
from omnistage.kernels import work_sharing
from omnistage.layers.decode_program import _OP_QK_NORM, DISABLE_ENV, DecodeProgramBuilder
from omnistage.layers.ggml_types import GGMLType
from omnistage.layers.norm import RMSNorm
from omnistage.layers.quant_paths import ACTIVATIONS_ENV
from omnistage.layers.quantized_linear import QuantizedLinear
from omnistage.models.loader import resolve_model
from tests.test_loading import tiny_model, write_gguf

needs_kernels = pytest.mark.skipif(
    kernels.load() is None or kernels.load_quant() is None, reason="no C compiler"
)

PROMPTS = [[5, 17, 33, 9, 100], list(range(40, 77)), [7] * 3, list(range(200, 219))]
TYPES = {"attn_q": Q.Q8_0, "attn_k": Q.Q8_0, "attn_v": Q.Q8_0, "attn_output": Q.Q4_0}
TYPES |= {"ffn_gate": Q.Q4_1, "ffn_up": Q.Q4_0, "ffn_down": Q.Q8_0}


def _gguf(tmp_path_factory, arch: str):
    cache = tmp_path_factory.mktemp("cache")
    path = tmp_path_factory.mktemp("gguf") / f"tiny-{arch}.gguf"
    model = tiny_model(arch, tied=True)
    types = {f"blk.{i}.{k}.weight": t for i in range(2) for k, t in TYPES.items()}
    write_gguf(path, model, arch, {"token_embd.weight": Q.Q8_0, **types})
    return path, cache


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def gguf_file(request, tmp_path_factory):
    """A tiny quantized llama, Qwen2 (bias on q, k, v) or Qwen3 (RMSNorm on each q and k
    head, head_dim 32 of hidden 64 / 4 heads), converted under its own cache."""
    path, cache = _gguf(tmp_path_factory, request.param)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMNISTAGE_CACHE_DIR", str(cache))
        resolve_model(str(path))
        yield path


def _model(llm: LLM) -> torch.nn.Module:
    return llm.engine.core.executor.runner.model


def _run(llm: LLM) -> list[tuple[list[int], list]]:
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [
        (
            list(o.outputs[0].token_ids),
            [{k: v.logprob for k, v in step.items()} for step in o.outputs[0].logprobs],
        )
        for o in outs
    ]


@needs_kernels
@pytest.mark.parametrize("activations", ["float32", "int8"])
def test_program_equals_the_layers_bit_for_bit(gguf_file, activations, monkeypatch):
    """Batches of 4 decodes of different context lengths (each step: one C call) give the
    same tokens and log-probs, exactly, as the same model run layer by layer."""
    monkeypatch.setenv(ACTIVATIONS_ENV, activations)
    llm = LLM(str(gguf_file), async_scheduling=False)
    programmed = _run(llm)
    program = _model(llm)._program
    assert program is not None and program.steps_run >= 11  # every step after the prefill
    monkeypatch.setenv(DISABLE_ENV, "1")
    layered = LLM(str(gguf_file), async_scheduling=False)
    assert _run(layered) == programmed
    assert _model(layered)._program is None


@needs_kernels
def test_qwen3_programs_normalise_q_and_k_between_the_qkv_product_and_rotary(gguf_file):
    """Qwen3 decode steps run as a program (not refused for its q/k norm): one q/k norm op
    per layer, reading the rows the qkv product wrote, right before rotary; other
    architectures have none."""
    llm = LLM(str(gguf_file), async_scheduling=False)
    _run(llm)
    model = _model(llm)
    program = model._program
    assert program is not None and program.steps_run >= 11
    kinds = [op.kind for op in program._ops]
    if "qwen3" not in gguf_file.name:
        assert _OP_QK_NORM not in kinds
        return
    attn = model.layers[0].self_attn
    norms = [i for i, kind in enumerate(kinds) if kind == _OP_QK_NORM]
    assert len(norms) == len(model.layers)
    for i in norms:
        op, qkv = program._ops[i], program._ops[i - 1]
        assert (qkv.kind, qkv.dst, qkv.width) == (2, op.src, op.width)  # the qkv product
        assert (program._ops[i + 1].kind, program._ops[i + 1].src) == (3, op.src)  # rotary
        assert (op.heads, op.kv_heads, op.head_dim) == (4, 2, 32)
    assert program._ops[norms[0]].weight == attn.q_norm.weight.data_ptr()
    assert program._ops[norms[0]].k_weight == attn.k_norm.weight.data_ptr()


def _switch_to_int8(llm: LLM) -> None:
    for module in _model(llm).modules():
        if isinstance(module, QuantizedLinear):
            module.activations = "int8"


@needs_kernels
def test_program_follows_a_change_of_kernel_path(gguf_file, monkeypatch):
    """Reassigning a layer's `activations` after the program was built rebuilds it (no
    prefix caching: the second run must not reuse the first run's keys)."""
    monkeypatch.setenv(ACTIVATIONS_ENV, "float32")
    llm = LLM(str(gguf_file), async_scheduling=False, enable_prefix_caching=False)
    _run(llm)
    first = _model(llm)._program
    _switch_to_int8(llm)
    int8 = _run(llm)
    assert _model(llm)._program is not first and _model(llm)._program.steps_run >= 11
    monkeypatch.setenv(DISABLE_ENV, "1")
    layered = LLM(str(gguf_file), async_scheduling=False)
    _switch_to_int8(layered)
    assert _run(layered) == int8


@needs_kernels
def test_models_without_a_c_path_run_layer_by_layer(gguf_file):
    """Float weights (dtype named) have no quantized kernel: no program, same engine."""
    llm = LLM(str(gguf_file), dtype="float32", async_scheduling=False)
    assert len(_run(llm)) == len(PROMPTS)
    assert _model(llm)._program is None


def _small_program():
    """RMSNorm then a Q8_0 product: a program needing no KV cache."""
    torch.manual_seed(0)
    norm = RMSNorm(64, 1e-5, torch.float32)
    norm.weight.data.uniform_(0.5, 1.5)
    blocks = quants.quantize(np.random.default_rng(0).standard_normal((96, 64), np.float32), Q.Q8_0)
    layer = QuantizedLinear.from_gguf_bytes(blocks, GGMLType.Q8_0, 64, 96)
    b = DecodeProgramBuilder(64)
    program = b.build(b.linear(b.rms_norm(b.input, norm), layer, "silu"))
    return program, lambda x: layer.silu(norm(x))


@needs_kernels
def test_a_forked_child_runs_programs_on_a_pool_of_its_own():
    """The parent's pool threads do not exist in a forked child: its first program starts
    its own instead of waiting for them at a barrier."""
    program, reference = _small_program()
    x = torch.randn(3, 64)
    meta = SimpleNamespace(decode_block_table=torch.zeros(3, 1, dtype=torch.int64))
    meta.slot_mapping = meta.decode_seq_lens = torch.zeros(3, dtype=torch.int64)
    positions = torch.zeros(3, dtype=torch.int64)
    previous = work_sharing.num_threads()
    work_sharing.set_num_threads(2)
    try:
        with torch.inference_mode():
            expected = reference(x)
            assert torch.equal(program.run(x, positions, meta), expected)  # the pool starts
            pid = os.fork()
            if pid == 0:  # the child: exit status 0 when its program gave the same rows
                os._exit(0 if torch.equal(program.run(x, positions, meta), expected) else 1)
    finally:
        work_sharing.set_num_threads(previous)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's program hung")
    assert os.waitstatus_to_exitcode(done[1]) == 0
