"""`GlmImageDecoder` against diffusers' `GlmImagePipeline` on a tiny float64 checkpoint.

The reference is the pipeline itself, loaded from the same directory without its AR prior
(`vision_language_encoder=None, processor=None`) and given the prior tokens the way
`generate_prior_tokens` would hand them over (large grid extracted and upsampled by the
pipeline's own helpers, grid sizes from transformers' `GlmImageProcessor`), the same initial
latents, steps and guidance. Our side is the loop the diffusion engine runs: encode,
new_scheduler, initial_latents, then predict + each request's own `scheduler.step`, decode.
"""

from __future__ import annotations

import inspect
import json
import shutil

import numpy as np
import pytest
import torch

from omnistage.diffusion.model import DiffusionInput, load_diffusion_model
from omnistage.diffusion.params import DiffusionParams
from omnistage.families.glm_image.decoder import GlmImageDecoder
from omnistage.families.glm_image.decoder_checkpoint import (
    PIPELINE_GUIDANCE,
    PIPELINE_MAX_SEQUENCE_LENGTH,
    PIPELINE_STEPS,
)
from omnistage.families.glm_image.decoder_inputs import glyph_texts, prior_grids
from omnistage.families.glm_image.tiny_decoder import (
    PRIOR_VOCAB_SIZE,
    save_tiny_glm_image_decoder,
)

STEPS = 3
PROMPTS = [
    "A poster that says \"GRAND OPENING\" and 'today only', with “50% off” and 「你好」",
    "A shop sign reading \"bakery\" above a door that says 'open'",  # 2 texts: the pad quirk
    "A watercolour of a lighthouse at dusk",  # no quoted text
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_glm_image_decoder(tmp_path_factory.mktemp("glm-image"), torch.float64)


@pytest.fixture(scope="module")
def model(checkpoint) -> GlmImageDecoder:
    model = load_diffusion_model(checkpoint, torch.float64)
    assert isinstance(model, GlmImageDecoder)
    return model


@pytest.fixture(scope="module")
def pipe(checkpoint):
    from diffusers import GlmImagePipeline

    pipe = GlmImagePipeline.from_pretrained(
        checkpoint, dtype=torch.float64, vision_language_encoder=None, processor=None
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def target_shape(height: int, width: int) -> tuple[int, int, int, int]:
    """transformers' own grid sizes (the method does not use its processor)."""
    from transformers import GlmImageProcessor

    return GlmImageProcessor._get_target_shape(None, height=height, width=width)


def generated_tokens(height: int, width: int, seed: int, vocab: int = PRIOR_VOCAB_SIZE):
    """What the prior would generate: preview grid, large grid, end token."""
    token_h, token_w, preview_h, preview_w = target_shape(height, width)
    n = preview_h * preview_w + token_h * token_w + 1
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def pipeline_prior_ids(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """`generate_prior_tokens`' extraction and upsampling, with the pipeline's helpers."""
    from diffusers import GlmImagePipeline

    token_h, token_w, preview_h, preview_w = target_shape(height, width)
    grids = torch.tensor([[1, token_h, token_w], [1, preview_h, preview_w]])
    _, offset, token_h, token_w = GlmImagePipeline._compute_generation_params(grids, True)
    large = GlmImagePipeline._extract_large_image_tokens(
        tokens.unsqueeze(0), 0, offset, token_h * token_w
    )
    return GlmImagePipeline._upsample_token_ids(large, token_h, token_w)


def request(model, prompt, height, width, guidance, seed, prior_seed=None, **extra):
    params = model.resolve(
        DiffusionParams(
            height=height,
            width=width,
            num_inference_steps=STEPS,
            guidance_scale=guidance,
            seed=seed,
            **extra,
        ),
        default_seed=0,
    )
    prior = generated_tokens(height, width, seed if prior_seed is None else prior_seed)
    return DiffusionInput(prompt, params, prior)


def denoise(model, items, start=None):
    """The engine contract: requests join at iteration `start[i]` and step together with
    whoever is running; every request steps its own scheduler. Returns final latents."""
    start = start or [0] * len(items)
    conditions = model.encode(items)
    schedulers = [model.new_scheduler(item.params) for item in items]
    latents = [model.initial_latents(item.params) for item in items]
    steps = [0] * len(items)
    iteration = 0
    while any(s < len(sch.timesteps) for s, sch in zip(steps, schedulers, strict=True)):
        active = [
            i
            for i in range(len(items))
            if start[i] <= iteration and steps[i] < len(schedulers[i].timesteps)
        ]
        timesteps = torch.stack([schedulers[i].timesteps[steps[i]] for i in active])
        pred = model.predict(
            torch.cat([latents[i] for i in active]),
            timesteps,
            [conditions[i] for i in active],
            [items[i].params.guidance_scale for i in active],
        )
        for row, i in enumerate(active):
            latents[i] = schedulers[i].step(
                pred[row : row + 1], timesteps[row], latents[i], return_dict=False
            )[0]
            steps[i] += 1
        iteration += 1
    return latents


# -- parity with diffusers -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "prompt, size, guidance",
    [(PROMPTS[0], (64, 96), 1.0), (PROMPTS[1], (96, 64), 2.5), (PROMPTS[2], (128, 128), 4.0)],
)
def test_same_image_as_diffusers(model, pipe, prompt, size, guidance):
    height, width = size
    item = request(model, prompt, height, width, guidance, seed=7)
    initial = model.initial_latents(item.params)
    (latents,) = denoise(model, [item])
    ours = model.decode_float(latents)
    pixels = model.decode(latents)

    reference = pipe(
        prompt=prompt,
        height=height,
        width=width,
        num_inference_steps=STEPS,
        guidance_scale=guidance,
        latents=initial.clone(),
        prior_token_ids=pipeline_prior_ids(item.prior_token_ids, height, width),
        output_type="np",
    ).images
    assert ours.shape == reference.shape == (1, height, width, 3)
    assert np.abs(ours - reference).max() <= 1e-6
    assert pixels.dtype == torch.uint8 and pixels.shape == (1, height, width, 3)
    expected = np.stack([np.array(im) for im in pipe.image_processor.numpy_to_pil(reference)])
    assert np.array_equal(pixels.numpy(), expected)
    assert reference.std() > 0.05  # a real image, not a constant


def test_glyph_embeddings_as_the_pipeline(model, pipe):
    for prompt in [*PROMPTS, ""]:
        assert glyph_texts(prompt) == pipe.get_glyph_texts(prompt)[0]
        ours = model._glyph_embeds(prompt)
        with torch.no_grad():  # as in `__call__` (with grad, SDPA picks another kernel)
            theirs = pipe._get_glyph_embeds(
                [prompt], PIPELINE_MAX_SEQUENCE_LENGTH, "cpu", torch.float64
            )
        assert torch.equal(ours, theirs)
        assert model.count_text_tokens(prompt) == ours.shape[1]
    # two texts: every row gets a leading pad token (diffusers counts texts, not tokens)
    assert model.count_text_tokens("'ab' and 'c'") == (1 + 2 + 1) + (1 + 1 + 1)


def test_prior_grids_as_the_processor():
    sizes = [(32, 32), (64, 96), (96, 64), (1024, 1024), (1152, 768), (32, 2048), (2048, 32)]
    for height, width in sizes:
        token_h, token_w, preview_h, preview_w = target_shape(height, width)
        assert prior_grids(height, width) == ((token_h, token_w), (preview_h, preview_w))


def test_defaults_from_the_pipeline(checkpoint, model, pipe):
    from diffusers import GlmImagePipeline

    defaults = inspect.signature(GlmImagePipeline.__call__).parameters
    assert defaults["num_inference_steps"].default == PIPELINE_STEPS == model.default_steps
    assert defaults["guidance_scale"].default == PIPELINE_GUIDANCE == model.default_guidance
    assert defaults["max_sequence_length"].default == PIPELINE_MAX_SEQUENCE_LENGTH
    assert model.max_text_tokens == PIPELINE_MAX_SEQUENCE_LENGTH
    assert model.default_height == model.default_width == pipe.default_sample_size * 8
    assert model.size_multiple == 32 == pipe.vae_scale_factor * 2 * 2
    limits = GlmImageDecoder.read_limits(checkpoint)  # configs and tokenizer only
    for field in ("default_height", "default_steps", "size_multiple", "max_text_tokens"):
        assert getattr(limits, field) == getattr(model, field)
    assert limits.count_text_tokens(PROMPTS[0]) == model.count_text_tokens(PROMPTS[0])


# -- batching ------------------------------------------------------------------------------------
def test_batched_equals_alone(model):
    items = [
        request(model, PROMPTS[0], 64, 64, 2.5, seed=1),
        request(model, PROMPTS[2], 64, 64, 1.0, seed=2),
        request(model, PROMPTS[1], 64, 64, 5.0, seed=3),
    ]
    lengths = {c.glyph_embeds.shape[1] for c in model.encode(items)} | {1}  # negatives: ""
    calls = []
    hook = model.transformer.register_forward_pre_hook(
        lambda _, args, kwargs: calls.append(kwargs["hidden_states"].shape[0]), with_kwargs=True
    )
    try:
        model.predict(
            torch.cat([model.initial_latents(i.params) for i in items]),
            torch.full((3,), 999.0),
            model.encode(items),
            [i.params.guidance_scale for i in items],
        )
    finally:
        hook.remove()
    assert len(calls) == len(lengths) and sum(calls) == 3 + 2  # rows of equal length share a call

    # the third request joins one step late, as in continuous batching
    together = model.decode_float(torch.cat(denoise(model, items, start=[0, 0, 1])))
    for row, item in enumerate(items):
        (alone,) = denoise(model, [item])
        assert np.abs(together[row] - model.decode_float(alone)[0]).max() <= 1e-9
    assert np.abs(together[0] - together[1]).max() > 0.01


def test_every_condition_matters(model):
    base = request(model, PROMPTS[0], 64, 64, 3.0, seed=1)
    variants = [
        request(model, PROMPTS[0], 64, 64, 3.0, seed=1, prior_seed=99),  # other prior tokens
        request(model, PROMPTS[0].replace("today", "tomorrow"), 64, 64, 3.0, seed=1),
        request(model, PROMPTS[0], 64, 64, 1.0, seed=1),  # no guidance
        request(model, PROMPTS[0], 64, 64, 3.0, seed=1, negative_prompt="no 'text'"),
    ]
    latents = model.initial_latents(base.params)
    t = torch.tensor([500.0])

    def velocity(item):
        (condition,) = model.encode([item])
        return model.predict(latents, t, [condition], [item.params.guidance_scale])

    reference = velocity(base)
    for item in variants:
        assert (velocity(item) - reference).abs().max() > 1e-4


# -- refusals ------------------------------------------------------------------------------------
def test_bad_sizes_name_the_field(checkpoint, model):
    limits = GlmImageDecoder.read_limits(checkpoint)
    for resolve in (model.resolve, limits.resolve):
        for field, value in (("height", 48), ("width", 100), ("height", 4096), ("width", 16)):
            with pytest.raises(ValueError, match=field):
                resolve(DiffusionParams(**{field: value}), 0)


def test_too_long_prompts_name_the_field(model):
    model.check_prompt("'" + "a" * 2046 + "'")  # 2046 bytes + </s>
    model.check_prompt("x" * 5000)  # no quoted text: one glyph token
    with pytest.raises(ValueError, match="^prompt"):
        model.check_prompt("'" + "a" * 2048 + "'")
    with pytest.raises(ValueError, match="^prompt"):
        model.check_prompt("'" + "a" * 1200 + "' '" + "b" * 1200 + "'")
    item = request(model, "x", 64, 64, 2.0, seed=1, negative_prompt="'" + "n" * 3000 + "'")
    with pytest.raises(ValueError, match="^negative_prompt"):
        model.encode([item])


def test_bad_prior_tokens_name_the_field(model):
    good = request(model, "x", 64, 96, 1.0, seed=1)
    tokens = good.prior_token_ids
    token_h, token_w, preview_h, preview_w = target_shape(64, 96)
    preview = preview_h * preview_w
    cases = [
        None,  # no prior at all
        tokens[: preview + 2],  # stopped early
        torch.cat([tokens, tokens[:5]]),  # generated for another size
        generated_tokens(64, 64, seed=1),
        tokens.clone().index_fill_(0, torch.tensor([preview + 1]), PRIOR_VOCAB_SIZE),
    ]
    for bad in cases:
        item = DiffusionInput("x", good.params, bad)
        with pytest.raises(ValueError, match="^prior_token_ids"):
            model.encode([item])
    # the end token may be left off, and preview tokens are never embedded
    (reference,) = model.encode([good])
    relaxed = tokens[:-1].clone()
    relaxed[0] = PRIOR_VOCAB_SIZE + 5
    (condition,) = model.encode([DiffusionInput("x", good.params, relaxed.unsqueeze(0))])
    assert torch.equal(condition.prior_token_ids, reference.prior_token_ids)
    assert condition.prior_token_ids.shape == (1, (64 // 16) * (96 // 16))


# -- checkpoint ----------------------------------------------------------------------------------
def test_checkpoint_layout(checkpoint, tmp_path):
    index = json.loads((checkpoint / "model_index.json").read_text())
    assert index["_class_name"] == "GlmImagePipeline"
    assert {"vision_language_encoder", "processor", "transformer", "vae"} <= set(index)
    assert not (checkpoint / "vision_language_encoder").exists()  # never read

    copy = shutil.copytree(checkpoint, tmp_path / "copy")
    index["processor"] = ["transformers", "SomethingElse"]
    (copy / "model_index.json").write_text(json.dumps(index))
    save_tiny_glm_image_decoder(copy, seed=1)  # merges: the prior's entries are kept
    assert json.loads((copy / "model_index.json").read_text())["processor"][1] == "SomethingElse"

    shutil.rmtree(copy / "transformer")
    with pytest.raises(ValueError, match="transformer"):
        GlmImageDecoder.load(copy, torch.float32, torch.device("cpu"))
