"""CosyVoice3's flow decoder (omnistage.families.cosyvoice3.flow) against the reference.

`tests/fixtures/cosyvoice3/flow_reference.pt` is written by `make_flow_fixture.py` (beside
it, run by hand in the reference venv) from FunAudioLLM/CosyVoice's
`CausalMaskedDiffWithDiT` on a tiny DiT with seeded weights, which `random_weights` here
redraws. Float64 must agree to 1e-10 and float32 to 1e-5 (both measured bit-identical,
max difference 0.0, with torch 2.13 CPU on either side).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from omnistage.families.cosyvoice3.flow import NOISE_FRAMES, CosyVoice3Flow, FlowConfig

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "cosyvoice3" / "flow_reference.pt"
ATOL64 = 1e-10
ATOL32 = 1e-5


@pytest.fixture(scope="module")
def reference() -> dict:
    return torch.load(FIXTURE)


def random_weights(
    shapes: dict[str, tuple[int, ...]], seed: int, std: float
) -> dict[str, torch.Tensor]:
    """As make_flow_fixture.random_weights: sorted names, one generator, float64."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(shapes[name], generator=generator, dtype=torch.float64) * std
        for name in sorted(shapes)
    }


def _build(reference: dict, dtype: torch.dtype) -> CosyVoice3Flow:
    with torch.random.fork_rng():
        flow = CosyVoice3Flow(FlowConfig.from_dict(reference["tiny"]))
    shapes = {name: tuple(p.shape) for name, p in flow.named_parameters()}
    weights = random_weights(shapes, reference["weight_seed"], reference["weight_std"])
    flow.load_state_dict(
        {**weights, "decoder.estimator.rotary_embed.inv_freq": reference["inv_freq"]}
    )
    return flow.to(dtype).eval()


@pytest.fixture(scope="module")
def flow64(reference) -> CosyVoice3Flow:
    return _build(reference, torch.float64)


def _infer(flow: CosyVoice3Flow, case: dict) -> torch.Tensor:
    return flow.inference(
        case["token"],
        case["prompt_token"],
        case["prompt_feat"],
        case["embedding"],
        streaming=case["streaming"],
        finalize=case["finalize"],
    )


def test_state_dict_names_are_the_references(reference):
    with torch.random.fork_rng():
        flow = CosyVoice3Flow(FlowConfig.from_dict(reference["tiny"]))
    ours = [(name, tuple(t.shape)) for name, t in flow.state_dict().items()]
    assert ours == reference["names"]
    assert torch.equal(
        flow.state_dict()["decoder.estimator.rotary_embed.inv_freq"], reference["inv_freq"]
    )


@pytest.mark.parametrize("name", ["prompt_full", "prompt_stream", "no_prompt"])
def test_float64_matches_the_reference(flow64, reference, name):
    case = reference["cases"][name]
    mel = _infer(flow64, case)
    assert mel.dtype == torch.float64
    assert mel.shape == case["mel64"].shape
    assert (mel - case["mel64"]).abs().max().item() < ATOL64
    # the reference's own (float32-cast) output
    assert torch.allclose(mel.float(), case["mel32"], rtol=0, atol=1e-6)


def test_float32_matches_the_reference(reference):
    case = reference["cases"]["prompt_full"]
    mel = _infer(_build(reference, torch.float32), case)
    assert mel.dtype == torch.float32
    assert (mel - case["mel32_run"]).abs().max().item() < ATOL32


def test_the_result_depends_on_the_inputs(flow64, reference):
    """The fixture is not trivial: another speaker vector moves the mel well past tolerance."""
    case = dict(reference["cases"]["prompt_full"])
    case["embedding"] = -case["embedding"]
    assert (_infer(flow64, case) - case["mel64"]).abs().max().item() > 1e-2


def test_streaming_chunks_do_not_see_the_future(flow64, reference):
    """With chunked attention, frames of full chunks are those of a longer decode."""
    case = reference["cases"]["no_prompt"]  # 15 tokens, chunk 16 frames
    longer = dict(case, token=torch.cat((case["token"], case["token"][:, :5]), dim=1))
    chunk = reference["tiny"]["static_chunk_size"]
    full = _infer(flow64, longer)
    assert torch.allclose(_infer(flow64, case)[..., :chunk], full[..., :chunk], rtol=0, atol=1e-12)


def test_noise_and_rng_follow_the_reference(reference):
    torch.manual_seed(reference["probe_seed"])
    flow = CosyVoice3Flow(FlowConfig.from_dict(reference["tiny"]))
    assert torch.equal(torch.rand(4), reference["rng_probe"])
    noise = flow.decoder.rand_noise
    assert "decoder.rand_noise" not in flow.state_dict()
    assert torch.equal(noise[:, :, :16], reference["noise_head"])
    assert float(noise.double().sum()) == reference["noise_sum"]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        assert torch.equal(noise, torch.randn(1, 80, NOISE_FRAMES))


def test_config_defaults_and_from_dict():
    config = FlowConfig()
    assert (config.vocab_size, config.dit_depth, config.static_chunk_size) == (6561, 22, 50)
    assert FlowConfig.from_dict({"dit_depth": 4}) == dataclasses.replace(config, dit_depth=4)
    for bad, field in [
        ({"dit_layers": 4}, "dit_layers"),
        ({"dit_depth": 0}, "dit_depth"),
        ({"dit_depth": "22"}, "dit_depth"),
        ({"input_size": 100}, "input_size"),
        ({"dit_dim": 1000}, "dit_dim"),
        ({"t_scheduler": "sigmoid"}, "t_scheduler"),
        ({"inference_cfg_rate": -1.0}, "inference_cfg_rate"),
    ]:
        with pytest.raises(ValueError, match=field):
            FlowConfig.from_dict(bad)


def test_bad_inputs_raise_value_errors_naming_the_argument(flow64, reference):
    case = reference["cases"]["prompt_full"]
    prompt_len = case["prompt_token"].shape[1]
    bad = [
        ("token", {"token": torch.tensor([[0, 6561]])}),
        ("token", {"token": torch.tensor([[-1, 5]])}),
        ("token", {"token": torch.zeros(2, 4, dtype=torch.long)}),
        ("token", {"token": torch.zeros(1, 4)}),
        ("token", {"token": torch.zeros(1, 3, dtype=torch.long), "finalize": False}),
        ("prompt_token", {"prompt_token": torch.full((1, prompt_len), 7000)}),
        ("prompt_feat", {"prompt_feat": case["prompt_feat"][:, 1:]}),
        ("prompt_feat", {"prompt_feat": case["prompt_feat"][..., :40]}),
        ("embedding", {"embedding": case["embedding"][:, :80]}),
        ("token", {"token": torch.zeros(1, NOISE_FRAMES, dtype=torch.long)}),
    ]
    for argument, change in bad:
        with pytest.raises(ValueError, match=argument):
            _infer(flow64, {**case, **change})
