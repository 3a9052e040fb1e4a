"""The code predictor's C step (`layers/dense_step.py`, `kernels/dense_step.c`) against its
torch path: float32 logits within 2e-5 of the largest logit at every code step, greedy
codes equal; a row's codes and logits are bit-identical alone or in a batch; float64 and
`OMNISTAGE_DISABLE_DECODE_PROGRAM` keep the torch path."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from omnistage import kernels
from omnistage.families.qwen3_omni.code_predictor import CodePredictor
from omnistage.layers.dense_step import DISABLE_ENV, embedding_sum
from omnistage.layers.rotary import DefaultRope

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="no C compiler here")

TOLERANCE = 2e-5
"""Of the largest |logit|: float32 sums in another order than torch's GEMM."""


def _predictor(
    dtype: torch.dtype, talker_hidden: int | None, bias: bool, seed: int = 0
) -> CodePredictor:
    config = SimpleNamespace(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        attention_bias=bias,
        num_code_groups=16,
    )
    predictor = CodePredictor(config, dtype, DefaultRope(config), talker_hidden)
    g = torch.Generator().manual_seed(seed)
    for p in predictor.parameters():
        p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(dtype) * 0.3 + 0.05)
    return predictor


def _run(predictor: CodePredictor, hidden: torch.Tensor, embeds: torch.Tensor):
    logits: list[torch.Tensor] = []

    def greedy(j: int, lg: torch.Tensor) -> torch.Tensor:
        logits.append(lg.clone())
        return lg.argmax(-1)

    codes = predictor.generate(hidden, embeds, greedy)
    return codes, torch.stack(logits)


def _inputs(rows: int, width: int, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(rows)
    return (torch.randn(rows, width, generator=g, dtype=dtype) for _ in range(2))


@pytest.mark.parametrize(("talker_hidden", "bias"), [(48, False), (None, True)])
def test_c_step_matches_the_torch_path(monkeypatch, talker_hidden, bias):
    predictor = _predictor(torch.float32, talker_hidden, bias)
    hidden, embeds = _inputs(5, talker_hidden or 32)
    assert predictor.dense_step() is not None
    codes, logits = _run(predictor, hidden, embeds)
    monkeypatch.setenv(DISABLE_ENV, "1")
    assert predictor.dense_step() is None
    torch_codes, torch_logits = _run(predictor, hidden, embeds)
    assert torch.equal(codes, torch_codes)
    scale = torch_logits.abs().max()
    assert (logits - torch_logits).abs().max() <= TOLERANCE * scale
    assert not torch.equal(logits, torch_logits)  # the two paths really differ


def test_a_row_is_the_same_alone_or_in_a_batch():
    predictor = _predictor(torch.float32, 48, False, seed=1)
    hidden, embeds = _inputs(7, 48)
    codes, logits = _run(predictor, hidden, embeds)
    for row in (0, 3, 6):
        alone_codes, alone_logits = _run(predictor, hidden[row : row + 1], embeds[row : row + 1])
        assert torch.equal(alone_codes[0], codes[row])
        assert torch.equal(alone_logits[:, 0], logits[:, row])


def test_float64_keeps_the_torch_path():
    predictor = _predictor(torch.float64, 48, False)
    assert predictor.dense_step() is None
    reference = _predictor(torch.float32, 48, False)
    hidden, embeds = _inputs(3, 48, torch.float64)
    codes, _ = _run(predictor, hidden, embeds)
    c_codes, _ = _run(reference, hidden.float(), embeds.float())
    assert torch.equal(codes, c_codes)


def test_a_step_that_does_not_fit_is_refused():
    predictor = _predictor(torch.float32, None, False)
    step = predictor.dense_step()
    cache = step.new_cache(2)
    head = predictor.lm_head[0].weight
    with pytest.raises(ValueError, match="does not fit"):
        step.run(torch.zeros(2, 1, 16), 0, cache, head)
    with pytest.raises(ValueError, match="does not fit"):
        step.run(torch.zeros(2, 1, 32), 17, cache, head)
    with pytest.raises(ValueError, match="contiguous float32"):
        step.run(torch.zeros(2, 1, 32, dtype=torch.float64), 0, cache, head)


def test_a_step_from_codes_looks_them_up_as_the_embedding_does():
    # The code predictor's later steps pass the drawn codes and their table: the same
    # logits and cache, bit for bit, as the looked-up rows passed in.
    predictor = _predictor(torch.float32, 48, False)
    step = predictor.dense_step()
    table = predictor.model.codec_embedding[3].weight
    codes = torch.tensor([5, 0, 63, 17])
    first = torch.randn(4, 2, 48, generator=torch.Generator().manual_seed(1))
    caches = [step.new_cache(4) for _ in range(2)]
    for cache in caches:
        step.run(first, 0, cache, predictor.lm_head[0].weight)
    head = predictor.lm_head[4].weight
    by_rows = step.run(table[codes][:, None].contiguous(), 2, caches[0], head)
    by_codes = step.run_codes(codes, table, 2, caches[1], head)
    assert torch.equal(by_codes, by_rows)
    assert torch.equal(caches[1][:, :, :, :, :3], caches[0][:, :, :, :, :3])
    with pytest.raises(IndexError, match="outside the table's 64 rows"):
        step.run_codes(torch.tensor([1, 64, 2, 3]), table, 3, caches[1], head)
    with pytest.raises(IndexError, match="outside"):
        step.run_codes(torch.tensor([1, -1, 2, 3]), table, 3, caches[1], head)
    with pytest.raises(ValueError, match="int64"):
        step.run_codes(codes.int(), table, 3, caches[1], head)


def test_the_platform_leaves_the_c_step_its_weights(monkeypatch):
    from omnistage.platforms import cpu_linear
    from omnistage.platforms.cpu_linear import (
        PackedLinear,
        PanelLinear,
        onednn_available,
        pack_linears,
    )

    monkeypatch.setattr(cpu_linear, "PACK_MIN_WEIGHTS", 0)  # pack these tiny ones too
    predictor = _predictor(torch.float32, 48, False)
    hidden, embeds = _inputs(2, 48)
    codes, _ = _run(predictor, hidden, embeds)
    pack_linears(predictor)
    assert not any(isinstance(m, PackedLinear | PanelLinear) for m in predictor.modules())
    assert torch.equal(_run(predictor, hidden, embeds)[0], codes)
    monkeypatch.setenv(DISABLE_ENV, "1")  # ruled out at load: packed, and the torch path
    packed = _predictor(torch.float32, 48, False)
    pack_linears(packed)
    monkeypatch.delenv(DISABLE_ENV)
    if onednn_available():  # the platform's float32 product: column panels or oneDNN
        assert any(isinstance(m, PackedLinear | PanelLinear) for m in packed.modules())
    assert packed.dense_step() is None
    assert torch.equal(_run(packed, hidden, embeds)[0], codes)


def test_a_moved_weight_rebuilds_the_step():
    predictor = _predictor(torch.float32, None, False)
    step = predictor.dense_step()
    layer = predictor.model.layers[0].self_attn.qkv_proj
    assert predictor.dense_step() is step
    layer.weight = torch.nn.Parameter(layer.weight.clone(), requires_grad=False)
    rebuilt = predictor.dense_step()
    assert rebuilt is not None and rebuilt is not step


@pytest.mark.parametrize("talker_hidden", [48, None])
def test_a_fed_back_frames_embedding_sum_in_c_is_torchs_bit_for_bit(monkeypatch, talker_hidden):
    predictor = _predictor(torch.float32, talker_hidden, False, seed=5)
    codes = torch.randint(0, 64, (9, 15), generator=torch.Generator().manual_seed(2))
    summed = predictor.embed(codes)
    monkeypatch.setenv(DISABLE_ENV, "1")  # the lookups and adds in torch
    assert torch.equal(summed, predictor.embed(codes))
    monkeypatch.delenv(DISABLE_ENV)
    with pytest.raises(IndexError, match="outside the embedding tables' 64 rows"):
        predictor.embed(torch.full((2, 15), 64))
    assert embedding_sum([t.double() for t in _tables(predictor)], codes) is None  # float64


def _tables(predictor: CodePredictor) -> list[torch.Tensor]:
    return [e.weight for e in predictor.model.codec_embedding]
