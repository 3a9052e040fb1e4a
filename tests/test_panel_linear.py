"""A float32 checkpoint's linears on column panels (`layers/panel_linear.py`,
`kernels/panel_matmul.c`): the product and its fused forms to float32 rounding, every row
the same bits alone or in any batch, on any number of threads, the AVX-512 and portable
paths the same bits; the platform picks them on AVX-512 CPUs (`OMNISTAGE_F32_LINEARS`
says otherwise); a model's decode program runs them, bit for bit its layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from omnistage import LLM, SamplingParams, kernels
from omnistage.kernels import work_sharing
from omnistage.layers.decode_program import DISABLE_ENV
from omnistage.layers.linear import Linear
from omnistage.layers.panel_linear import PanelLinear
from omnistage.platforms import cpu_linear

needs_kernels = pytest.mark.skipif(kernels.load_quant() is None, reason="no C compiler")
pytestmark = needs_kernels

SHAPES = [(64, 64), (100, 70), (576, 200), (33, 129)]  # K, N: tails in both


def _layer(k, n, bias=True, seed=0, isa=None):
    g = torch.Generator().manual_seed(seed)
    lin = Linear(k, n, bias, torch.float32)
    lin.weight.copy_(torch.randn(n, k, generator=g))
    if bias:
        lin.bias.copy_(torch.randn(n, generator=g))
    return lin, PanelLinear(lin, isa=isa)


def _forms(layer, x, other):
    return [layer(x), layer.silu(x), layer.mul(x, other), layer.add(x, other)]


@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_products_and_fused_forms_match_float64(k, n, bias):
    lin, panels = _layer(k, n, bias)
    g = torch.Generator().manual_seed(1)
    for m in (1, 5, 13, 200):
        x, other = torch.randn(m, k, generator=g), torch.randn(m, n, generator=g)
        w, b = lin.weight.double(), None if lin.bias is None else lin.bias.double()
        y = F.linear(x.double(), w, b)
        want = [y, F.silu(y), y * other.double(), y + other.double()]
        for got, ref in zip(_forms(panels, x, other), want, strict=True):
            torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-4)
    assert torch.equal(panels.unpacked_weight(), lin.weight)


def test_a_row_is_the_same_bits_alone_in_any_batch_and_on_any_threads():
    _, panels = _layer(576, 200)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(300, 576, generator=g)
    batched = panels(x)
    for i in (0, 7, 299):
        assert torch.equal(panels(x[i : i + 1])[0], batched[i])
    assert torch.equal(panels(x[5:17]), batched[5:17])
    before = work_sharing.num_threads(), torch.get_num_threads()
    try:
        work_sharing.set_num_threads(1)
        torch.set_num_threads(1)
        one_thread = panels(x)
    finally:
        work_sharing.set_num_threads(before[0])
        torch.set_num_threads(before[1])
    assert torch.equal(one_thread, batched)


def test_avx512_and_portable_paths_agree_bit_for_bit():
    if kernels.load_quant().quant_best_isa() < kernels.ISA_AVX512:
        pytest.skip("no AVX-512 here")
    _, fast = _layer(100, 70, isa=kernels.ISA_AVX512)
    _, portable = _layer(100, 70, isa=kernels.ISA_SCALAR)
    g = torch.Generator().manual_seed(3)
    x, other = torch.randn(9, 100, generator=g), torch.randn(9, 70, generator=g)
    for a, b in zip(_forms(fast, x, other), _forms(portable, x, other), strict=True):
        assert torch.equal(a, b)


def test_inputs_the_kernel_does_not_take_fall_back_to_f_linear():
    lin, panels = _layer(64, 64)
    x = torch.randn(3, 64, dtype=torch.float64)
    torch.testing.assert_close(panels(x), F.linear(x, lin.weight.double(), lin.bias.double()))
    assert panels(torch.empty(0, 64)).shape == (0, 64)


def test_the_platform_picks_panels_for_large_float32_linears(monkeypatch):
    side = 512  # 262144 weights: above PACK_MIN_WEIGHTS
    model = torch.nn.ModuleDict({"large": Linear(side, side, dtype=torch.float32)})
    cpu_linear.pack_linears(model)
    expected = cpu_linear.PanelLinear if cpu_linear.float32_panels() else cpu_linear.PackedLinear
    assert isinstance(model["large"], expected)
    monkeypatch.setenv(cpu_linear.F32_LINEARS_ENV, "onednn")
    assert not cpu_linear.float32_panels()
    monkeypatch.setenv(cpu_linear.F32_LINEARS_ENV, "fast")
    with pytest.raises(ValueError, match="OMNISTAGE_F32_LINEARS"):
        cpu_linear.float32_panels()


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory):
    """A float32 llama whose linears are over `PACK_MIN_WEIGHTS` (hidden 384)."""
    from omnistage.models.tiny_checkpoints import make_checkpoint

    return make_checkpoint(
        tmp_path_factory.mktemp("wide-llama"), "llama", hidden_size=384, intermediate_size=768
    )


def test_a_float32_checkpoint_decodes_as_a_program_bit_for_bit_its_layers(wide_llama, monkeypatch):
    if not cpu_linear.float32_panels() or kernels.load() is None:
        pytest.skip("column panels are not this CPU's float32 product")
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=3)
    prompts = [{"prompt_token_ids": list(range(3, 3 + n))} for n in (4, 19, 33)]

    def run():
        llm = LLM(str(wide_llama), async_scheduling=False, max_model_len=128)
        outs = llm.generate(prompts, params, use_tqdm=False)
        model = llm.engine.core.executor.runner.model
        assert any(isinstance(m, PanelLinear) for m in model.modules())
        got = [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]
        return got, model._program

    programmed, program = run()
    assert program is not None and program.steps_run >= 9
    monkeypatch.setenv(DISABLE_ENV, "1")
    layered, none = run()
    assert none is None
    assert [t for t, _ in layered] == [t for t, _ in programmed]
    for (_, a), (_, b) in zip(layered, programmed, strict=True):
        assert [{k: v.logprob for k, v in s.items()} for s in a] == [
            {k: v.logprob for k, v in s.items()} for s in b
        ]
