"""HunyuanImage-3's image head reusing the context's keys and values across denoising steps
(`HunyuanImageDenoiser.context_kv`): the same numbers as part 1's path that recomputes the
whole context every step, within float64 rounding, with and without guidance, and through
the pipeline's `encode` / `predict`."""

from __future__ import annotations

import pytest
import torch

from omnistage.diffusion.model import DiffusionInput
from omnistage.diffusion.params import ResolvedDiffusionParams
from omnistage.families.hunyuan_image3.denoise import DenoiseRequest, HunyuanImageDenoiser
from omnistage.families.hunyuan_image3.pipeline import HunyuanImage3Pipeline
from omnistage.families.hunyuan_image3.tiny import make_tiny_hunyuan_image3, token_ids

ATOL = 1e-12
"""float64 rounding: the two paths sum the same terms in a different order."""


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_hunyuan_image3(tmp_path_factory.mktemp("hy3kv"), seed=3, image_base_size=64)


def _request(**changes) -> DenoiseRequest:
    ids = token_ids(64)
    context = [1, 72, 101, 108, 108, 111, ids["<think>"], 50, 51, ids["</think>"], ids["<boi>"]]
    context += [ids["<img_size_64>"], ids["<img_ratio_16>"]]
    uncond = [t if t >= 259 else ids["<cfg>"] for t in context]
    values = dict(
        context=context,
        uncond_context=uncond,
        token_h=4,
        token_w=4,
        steps=3,
        guidance_scale=3.0,
        shift=3.0,
    )
    return DenoiseRequest(**{**values, **changes})


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_reused_kv_equals_recomputing_every_step(ckpt, guidance):
    denoiser = HunyuanImageDenoiser.from_checkpoint(ckpt, torch.float64)
    noise = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    request = _request(guidance_scale=guidance)
    recomputed = denoiser.generate(request, noise, reuse_kv=False)
    reused = denoiser.generate(request, noise, reuse_kv=True)
    torch.testing.assert_close(reused, recomputed, atol=ATOL, rtol=0)
    assert not torch.allclose(reused, noise, atol=0.1)  # it really moved


def test_context_kv_is_every_layers_keys_of_the_context(ckpt):
    denoiser = HunyuanImageDenoiser.from_checkpoint(ckpt, torch.float64)
    context = _request().context
    cached = denoiser.context_kv(context, torch.device("cpu"))
    assert cached.length == len(context) and len(cached.layers) == 3
    k, v = cached.layers[-1]
    assert k.shape == v.shape == (len(context), 2, 16)
    assert cached.nbytes == 3 * 2 * len(context) * 2 * 16 * 8
    # The first velocity from the cache equals the one from the ids.
    latents = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(1)).double()
    t = torch.tensor([900.0])
    with torch.no_grad():
        from_ids = denoiser.velocity(context, latents, t)
        from_cache = denoiser.velocity(cached, latents, t)
    torch.testing.assert_close(from_cache, from_ids, atol=ATOL, rtol=0)


def test_pipeline_encodes_the_kv_once_and_steps_on_it(ckpt):
    pipe = HunyuanImage3Pipeline.load(ckpt, torch.float64, torch.device("cpu"))
    request = _request()
    params = ResolvedDiffusionParams(64, 64, 3, 3.0, 0, "", False)
    prior = torch.tensor(request.context[:-2])  # up to <boi>: encode adds size and ratio
    (condition,) = pipe.encode([DiffusionInput("", params, prior)])
    assert condition.context == request.context
    assert condition.uncond_kv is not None and condition.uncond_kv.length == len(request.context)
    unguided = ResolvedDiffusionParams(64, 64, 3, 1.0, 0, "", False)
    assert pipe.encode([DiffusionInput("", unguided, prior)])[0].uncond_kv is None
    noise = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(2)).double()
    t = torch.tensor([700.0], dtype=torch.float64)
    v = pipe.predict(noise, t, [condition], [3.0])
    expected = pipe.denoiser.guided_velocity(
        condition.context, condition.uncond_context, noise, t.float(), 3.0
    )
    torch.testing.assert_close(v, expected, atol=ATOL, rtol=0)
