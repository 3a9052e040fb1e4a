"""The diffusion engine: step-level batching that never changes an image, aborts, progress,
and parameter checks (tiny float64 TextDiT)."""

from __future__ import annotations

import pytest
import torch

from omnistage.diffusion.engine import DiffusionEngine
from omnistage.diffusion.model import DiffusionInput, load_diffusion_model
from omnistage.diffusion.params import DiffusionParams
from omnistage.families.text_to_image.tiny import save_tiny_text_dit


@pytest.fixture(scope="module")
def dit(tmp_path_factory):
    path = save_tiny_text_dit(tmp_path_factory.mktemp("dit"), seed=3, dtype=torch.float64)
    return load_diffusion_model(path, torch.float64)


def _item(model, prompt: str, **params) -> DiffusionInput:
    """Small and short unless asked otherwise: 32x32 pixels, 3 steps."""
    params = {"height": 32, "width": 32, "num_inference_steps": 3} | params
    return DiffusionInput(prompt, model.resolve(DiffusionParams(**params), default_seed=0))


def _run(engine: DiffusionEngine, items: dict[str, DiffusionInput]) -> dict[str, torch.Tensor]:
    for request_id, item in items.items():
        engine.add_request(request_id, item)
    images = {}
    while engine.has_work():
        for event in engine.step():
            if event.finished:
                images[event.request_id] = event.image
    return images


def test_same_seed_same_image_alone_and_in_a_batch(dit) -> None:
    items = {
        f"r{i}": _item(dit, f"a red cat {i}", seed=100 + i, guidance_scale=[1.0, 4.5][i % 2])
        for i in range(6)
    }
    batched = DiffusionEngine(dit, max_num_seqs=8)
    together = _run(batched, items)
    assert batched.num_steps_run == 3  # all six shared every step
    for request_id, item in items.items():
        alone = _run(DiffusionEngine(dit, max_num_seqs=1), {request_id: item})[request_id]
        assert alone.shape == (32, 32, 3) and alone.dtype == torch.uint8
        assert torch.equal(alone, together[request_id])
    assert not torch.equal(together["r0"], together["r2"])  # seeds and prompts matter


def test_requests_join_running_batches_at_any_step(dit) -> None:
    """Continuous batching: a request arriving mid-way shares later steps at its own
    timestep and still gets the image it gets alone."""
    first, late = _item(dit, "first", seed=1), _item(dit, "late", seed=2)
    engine = DiffusionEngine(dit, max_num_seqs=4)
    engine.add_request("first", first)
    engine.step()
    engine.step()
    images = _run(engine, {"late": late})
    assert engine.num_steps_run == 2 + 3  # the late one shared the first's last step
    for request_id, item in (("first", first), ("late", late)):
        alone = _run(DiffusionEngine(dit, max_num_seqs=1), {request_id: item})[request_id]
        assert torch.equal(alone, images[request_id])


def test_only_requests_of_one_size_and_step_count_share_a_step(dit) -> None:
    items = {
        "wide": _item(dit, "a", seed=1, width=64),
        "square": _item(dit, "b", seed=2),
        "longer": _item(dit, "c", seed=3, num_inference_steps=4),
    }
    engine = DiffusionEngine(dit, max_num_seqs=8)
    images = _run(engine, items)
    assert images["wide"].shape == (32, 64, 3)
    assert engine.num_steps_run == 3 + 3 + 4
    for request_id, item in items.items():
        alone = _run(DiffusionEngine(dit, max_num_seqs=1), {request_id: item})[request_id]
        assert torch.equal(alone, images[request_id])


def test_waiting_requests_are_admitted_as_room_frees(dit) -> None:
    engine = DiffusionEngine(dit, max_num_seqs=2)
    items = {f"r{i}": _item(dit, "x", seed=i, num_inference_steps=2) for i in range(5)}
    for request_id, item in items.items():
        engine.add_request(request_id, item)
    engine.step()
    assert engine.counters() == {"waiting_requests": 3, "running_requests": 2}
    assert set(_run(engine, {})) == set(items)
    assert engine.counters() == {"waiting_requests": 0, "running_requests": 0}


def test_abort_mid_denoising_frees_the_request(dit) -> None:
    engine = DiffusionEngine(dit, max_num_seqs=1)
    engine.add_request("a", _item(dit, "a", seed=1))
    engine.add_request("b", _item(dit, "b", seed=2))
    engine.step()
    assert engine.counters() == {"waiting_requests": 1, "running_requests": 1}
    engine.abort("a")  # running, mid-way
    engine.abort("b")  # still waiting
    engine.abort("b")  # twice is harmless
    assert engine.counters() == {"waiting_requests": 0, "running_requests": 0}
    assert not engine.has_work() and engine.step() == []
    engine.add_request("a", _item(dit, "a", seed=1))  # the id is free again
    assert set(_run(engine, {})) == {"a"}


def test_progress_events_count_every_step(dit) -> None:
    engine = DiffusionEngine(dit, max_num_seqs=2)
    engine.add_request("p", _item(dit, "p", seed=1, num_inference_steps=4, progress=True))
    engine.add_request("q", _item(dit, "q", seed=2, num_inference_steps=4))
    events = []
    while engine.has_work():
        events += engine.step()
    progress = [(e.step, e.num_steps, e.finished) for e in events if e.request_id == "p"]
    assert progress == [(1, 4, False), (2, 4, False), (3, 4, False), (4, 4, True)]
    assert [e.finished for e in events if e.request_id == "q"] == [True]


def test_bad_parameters_name_the_field(dit) -> None:
    for fields, field in [
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"guidance_scale": -1.0}, "guidance_scale"),
        ({"guidance_scale": float("nan")}, "guidance_scale"),
        ({"height": 64.0}, "height"),
        ({"seed": -1}, "seed"),
    ]:
        with pytest.raises(ValueError, match=field):
            DiffusionParams(**fields)
    with pytest.raises(ValueError, match="nope: not a diffusion parameter"):
        DiffusionParams.from_fields({"nope": 1})
    for size, field in [({"height": 48 + 2}, "height"), ({"width": 4096}, "width")]:
        with pytest.raises(ValueError, match=f"{field}: .* is not supported"):
            dit.resolve(DiffusionParams(**size), 0)
    with pytest.raises(ValueError, match="prompt: .* text-encoder tokens"):
        dit.check_prompt("x" * (dit.max_text_tokens + 1))
    engine = DiffusionEngine(dit, max_num_seqs=1)
    engine.add_request("dup", _item(dit, "a"))
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request("dup", _item(dit, "a"))


@pytest.mark.parametrize("guidance", [1.0, 4.5])
def test_text_dit_draws_what_diffusers_pixart_pipeline_draws(dit, guidance) -> None:
    """TextDiT's components through diffusers' own `PixArtAlphaPipeline` (same noise, steps
    and guidance) give our engine's image."""
    import numpy as np
    from diffusers import PixArtAlphaPipeline

    item = _item(dit, "a red cat", seed=11, height=32, width=64, guidance_scale=guidance)
    ours = _run(DiffusionEngine(dit, max_num_seqs=2), {"r": item})["r"]
    scheduler = dit.new_scheduler(item.params)
    # What PixArt's loop asks of a scheduler that flow matching does not define: it starts
    # from unit noise and does not scale the model input.
    scheduler.init_noise_sigma = 1.0
    scheduler.scale_model_input = lambda sample, timestep: sample
    pipe = PixArtAlphaPipeline(
        tokenizer=dit.tokenizer,
        text_encoder=dit.text_encoder,
        transformer=dit.transformer,
        vae=dit.vae,
        scheduler=scheduler,
    )
    pipe.set_progress_bar_config(disable=True)
    image = pipe(
        "a red cat",
        height=32,
        width=64,
        num_inference_steps=3,
        guidance_scale=guidance,
        latents=dit.initial_latents(item.params),
        max_sequence_length=dit.max_text_tokens,
        clean_caption=False,
        use_resolution_binning=False,
        output_type="np",
    ).images[0]
    assert np.array_equal(ours.numpy(), (image * 255).round().astype(np.uint8))


@pytest.fixture(scope="module")
def dit32(tmp_path_factory):
    path = save_tiny_text_dit(tmp_path_factory.mktemp("dit32"), seed=3, dtype=torch.float32)
    return load_diffusion_model(path, torch.float32)


@pytest.mark.parametrize("scales", [(4.0,), (4.0, 1.0)], ids=["guided", "mixed"])
def test_float32_images_are_bit_identical_whatever_the_batch_and_timing(dit32, scales) -> None:
    """In float32 a batched GEMM may sum in another order than the same rows alone: a seeded
    image must still be identical alone (on the same engine), in batches of every size, and
    when it joins a batch mid-denoising (10 compositions, so a one-in-three flake cannot hide).
    Small latents run batched, padded to one shape; mixed guidance scales pad differently."""
    items = {
        f"r{i}": _item(dit32, f"a fox {i % 3}", seed=10 + i, guidance_scale=scales[i % len(scales)])
        for i in range(8)
    }
    alone = {
        rid: _run(DiffusionEngine(dit32, max_num_seqs=8), {rid: item})[rid]
        for rid, item in items.items()
    }
    names = list(items)
    for trial in range(10):
        size = 2 + trial % 7
        chosen = names[trial % 8 :] + names[: trial % 8]
        engine = DiffusionEngine(dit32, max_num_seqs=8)
        first, late = chosen[: size - 1], chosen[size - 1 : size]
        for rid in first:
            engine.add_request(rid, items[rid])
        images = {}
        for _ in range(trial % 3):  # the late request joins after 0, 1 or 2 steps
            images |= {e.request_id: e.image for e in engine.step() if e.finished}
        images |= _run(engine, {rid: items[rid] for rid in late})
        for rid in first + late:
            assert torch.equal(images[rid], alone[rid]), (trial, rid)
