"""The engine on a CUDA device: the CPU's equivalences hold there exactly (float64 tiny
models: sync = async = speculative, prefix caching and chunked prefill and preemption
change nothing, a request alone = in a batch, CUDA = CPU); float32 through the Triton
kernel equals the torch path's tokens; `dtype="auto"` computes in bfloat16 and the KV
cache is sized from the device's free memory; the recurrent layers run there too."""

from __future__ import annotations

import gc

import pytest
import torch

from omnistage import LLM, SamplingParams
from tests.test_engine_equivalence import workload

pytestmark = pytest.mark.gpu


def _tokens(path, prompts=None, params=None, **engine_args):
    llm = LLM(str(path), **engine_args)
    if prompts is None:
        prompts, params = workload()
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.engine.num_free_kv_blocks() == llm.engine.num_usable_kv_blocks()
    _close(llm)
    return [o.outputs[0].token_ids for o in outs]


def _close(llm) -> None:
    """Shut the engine down and give its device memory back before the next one starts."""
    llm.engine.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()


BASE = dict(max_model_len=256, dtype="float64")


@pytest.fixture(scope="module")
def cpu_reference(tiny_llama_f64):
    return _tokens(tiny_llama_f64, device="cpu", async_scheduling=False, **BASE)


@pytest.mark.parametrize(
    "engine_args",
    [
        dict(async_scheduling=False),
        dict(async_scheduling=True),
        dict(async_scheduling=True, executor_backend="thread"),
        dict(async_scheduling=False, enable_prefix_caching=False, enable_chunked_prefill=False),
        dict(async_scheduling=True, max_num_batched_tokens=24),  # chunks everywhere
        dict(async_scheduling=True, num_kv_blocks=17, max_num_batched_tokens=64),  # preemption
        dict(
            async_scheduling=False,
            speculative_config={"method": "ngram", "num_speculative_tokens": 3},
        ),
        dict(
            async_scheduling=True,
            speculative_config={"method": "ngram", "num_speculative_tokens": 3},
        ),
    ],
    ids=[
        "sync",
        "async-process",
        "async-thread",
        "no-cache-no-chunks",
        "chunked",
        "preempted",
        "spec-sync",
        "spec-async",
    ],
)
def test_float64_on_cuda_equals_the_cpu(tiny_llama_f64, cpu_reference, engine_args):
    assert _tokens(tiny_llama_f64, device="cuda", **{**BASE, **engine_args}) == cpu_reference


def test_a_request_alone_equals_it_in_a_batch(tiny_llama_f64, cpu_reference):
    prompts, params = workload()
    for i in (0, 5, 11):
        alone = _tokens(tiny_llama_f64, [prompts[i]], [params[i]], device="cuda", **BASE)
        assert alone[0] == cpu_reference[i]


def test_float32_triton_kernel_gives_the_torch_paths_tokens(tiny_qwen3, monkeypatch):
    """Greedy float32 on CUDA: the Triton kernel's tokens equal the portable torch path's
    (the same engine with the backend's `attend` switched off)."""
    from omnistage.layers.cuda_attention import TritonAttention

    prompts, _ = workload()
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    args = dict(device="cuda", dtype="float32", max_model_len=256, async_scheduling=False)
    calls = []
    real = TritonAttention.attend

    def counted(self, *a):
        calls.append(1)
        return real(self, *a)

    monkeypatch.setattr(TritonAttention, "attend", counted)
    kernel = _tokens(tiny_qwen3, prompts, greedy, max_num_batched_tokens=40, **args)
    assert calls
    monkeypatch.setattr(TritonAttention, "attend", lambda self, *a: None)
    torch_path = _tokens(tiny_qwen3, prompts, greedy, max_num_batched_tokens=40, **args)
    assert kernel == torch_path


def test_float32_sync_equals_async_on_cuda(tiny_qwen3):
    prompts, params = workload()
    args = dict(device="cuda", dtype="float32", max_model_len=256)
    sync = _tokens(tiny_qwen3, prompts, params, async_scheduling=False, **args)
    assert _tokens(tiny_qwen3, prompts, params, async_scheduling=True, **args) == sync


def test_auto_dtype_is_bfloat16(tiny_qwen3):
    llm = LLM(str(tiny_qwen3), device="cuda", max_model_len=256)
    assert llm.engine.config.torch_dtype == torch.bfloat16
    out = llm.generate(["hello there"], SamplingParams(temperature=0, max_tokens=8))
    assert len(out[0].outputs[0].token_ids) == 8
    _close(llm)


def test_kv_cache_budget_follows_gpu_memory_utilization():
    """What the platform leaves the KV cache grows by the fraction of the device asked."""
    from omnistage.config import EngineConfig
    from omnistage.platforms.cuda import CudaPlatform

    platform = CudaPlatform("cuda")
    model = torch.nn.Linear(64, 64).cuda()
    low, high = (
        platform.kv_cache_bytes(
            EngineConfig(device="cuda", max_model_len=256, gpu_memory_utilization=u), model
        )
        for u in (0.3, 0.6)
    )
    total = torch.cuda.mem_get_info()[1]
    assert low > 0 and abs((high - low) - 0.3 * total) < 0.01 * total


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_decode_graphs_give_the_eager_tokens(tiny_qwen3, dtype):
    """Decode steps replayed from CUDA graphs (batch sizes padded to a captured size) give
    the tokens of the same engine run eagerly."""
    prompts, _ = workload()
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    args = dict(device="cuda", dtype=dtype, max_model_len=256, async_scheduling=False)
    llm = LLM(str(tiny_qwen3), **args)
    graphed = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    alone = llm.generate(prompts[:1], greedy, use_tqdm=False)[0].outputs[0].token_ids
    forward = llm.engine.core.executor.runner.forward
    assert forward.replays > 0 and not forward.disabled
    _close(llm)
    eager = _tokens(tiny_qwen3, prompts, greedy, enforce_eager=True, **args)
    assert graphed == eager
    assert alone == eager[0]


@pytest.mark.parametrize("fixture", ["tiny_mamba2", "tiny_qwen3_next"])
def test_recurrent_layers_on_cuda_equal_the_cpu(fixture, request):
    path = request.getfixturevalue(fixture)
    prompts, params = workload()
    cpu = _tokens(path, prompts, params, device="cpu", async_scheduling=False, **BASE)
    for asynchronous in (False, True):
        args = dict(device="cuda", async_scheduling=asynchronous, **BASE)
        assert _tokens(path, prompts, params, **args) == cpu
