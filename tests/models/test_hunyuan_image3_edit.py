"""HunyuanImage-3 image editing: the draw stage denoising after a context that holds an input
image, against the reference (`tests/fixtures/hunyuan_image3/edit.pt`, made by
`make_edit_fixture.py` from the official modules on the same tiny random weights, float32;
its docstring says what is the reference's).

Our side runs the real path from the thinker's hand-off: the input encoder's prompt rows
(`input_encoder.py`) and the image grid as the edge hands them over (`edges.py`), the
pipeline's `encode` (the contexts cut after the generated `<boi>`, not the input image's,
and their layouts: `edit_context.py`) and the cached-KV denoiser. Checked: the
conditional and unconditional contexts are the reference's token for token, the first
step's two velocities and the latents after 3 guided steps within 1e-4 (measured 5.7e-6,
3.8e-6 on values up to 9.2, 1.3e-5 on values up to 5.6); the input image matters; an
answer cut before its `<boi>` is drawn after what it wrote (not cut at the input image's
`<boi>`); several images' blocks are found in order; a hand-off without the image's rows
is refused naming `image`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnistage.diffusion.model import DiffusionInput
from omnistage.diffusion.params import DiffusionParams
from omnistage.families.hunyuan_image3.edges import HunyuanImageContext
from omnistage.families.hunyuan_image3.flow_match import FlowMatchEuler
from omnistage.families.hunyuan_image3.input_encoder import HunyuanImage3InputEncoder
from omnistage.families.hunyuan_image3.pipeline import HunyuanImage3Pipeline
from omnistage.families.hunyuan_image3.resolution import resolution_group
from omnistage.families.hunyuan_image3.tiny import (
    IMAGE_BASE_SIZE,
    make_tiny_hunyuan_image3,
    token_ids,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hunyuan_image3"
FIXTURE = torch.load(FIXTURES / "edit.pt", weights_only=True)
I2T = torch.load(FIXTURES / "i2t.pt", weights_only=True)
IDS = token_ids()
ATOL = 1e-4


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    ckpt = make_tiny_hunyuan_image3(tmp_path_factory.mktemp("hy3edit"), seed=0)
    encoder = HunyuanImage3InputEncoder.from_checkpoint(ckpt, torch.float32)
    pipe = HunyuanImage3Pipeline.load(ckpt, torch.float32, torch.device("cpu"))
    return encoder, pipe


@pytest.fixture(scope="module")
def payload(parts) -> dict:
    return _payload(parts[0], FIXTURE["image"].numpy())


def _payload(encoder, image) -> dict:
    placeholder = [IDS["<boi>"], IDS["<img>"], IDS["<eoi>"]]
    encoded = encoder.encode(I2T["before"] + placeholder + I2T["after"], images=[image])
    prompt = torch.tensor(encoded.prompt_token_ids)
    written = FIXTURE["context"][len(prompt) :] + [2]  # the answer's end after its ratio
    return {
        "ids.prompt": prompt,
        "ids.output": torch.tensor(written),
        "mm.image_grid_thw": encoded.image_grid_thw,
        "embed.prefill": encoded.prompt_embeds,
    }


def _conditions(pipe, payload, guidance=FIXTURE["guidance_scale"]):
    height, width = resolution_group(pipe.base)[12]  # the fixture's <img_ratio_12>
    params = DiffusionParams(height, width, num_inference_steps=3, guidance_scale=guidance)
    resolved = pipe.limits.resolve(params, 0)
    fields = HunyuanImageContext().to_diffusion_input(payload)
    return pipe.encode([DiffusionInput("edit", resolved, **fields)])


def test_contexts_velocities_and_latents_match_reference(parts, payload):
    pipe = parts[1]
    assert payload["ids.prompt"].tolist() == FIXTURE["prompt"]
    (cond,) = _conditions(pipe, payload)
    assert cond.context == FIXTURE["context"]
    assert cond.uncond_context == FIXTURE["uncond_context"]
    denoiser, noise = pipe.denoiser, FIXTURE["noise"]
    scheduler = FlowMatchEuler(FIXTURE["steps"], FIXTURE["shift"])
    t = scheduler.timesteps[:1]
    with torch.no_grad():
        v = denoiser.velocity(cond.context_kv, noise, t)
        v_uncond = denoiser.velocity(cond.uncond_kv, noise, t)
    want = FIXTURE["first_velocities"]
    torch.testing.assert_close(v, want[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(v_uncond, want[1], atol=ATOL, rtol=0)
    latents = noise
    for t in scheduler.timesteps:
        step_v = pipe.predict(latents, t.reshape(1), [cond], [FIXTURE["guidance_scale"]])
        latents = scheduler.step(step_v, t.reshape(1), latents)[0]
    torch.testing.assert_close(latents, FIXTURE["latents"], atol=ATOL, rtol=0)
    assert not torch.allclose(latents, noise, atol=0.1)


def test_the_input_image_matters(parts):
    encoder, pipe = parts
    other = _payload(encoder, 255 - FIXTURE["image"].numpy())
    (cond,) = _conditions(pipe, other)
    assert cond.context == FIXTURE["context"]  # the same ids, other image rows
    t = FlowMatchEuler(FIXTURE["steps"], FIXTURE["shift"]).timesteps[:1]
    with torch.no_grad():
        v = pipe.denoiser.velocity(cond.context_kv, FIXTURE["noise"], t)
        v_uncond = pipe.denoiser.velocity(cond.uncond_kv, FIXTURE["noise"], t)
    want = FIXTURE["first_velocities"]
    assert (v - want[0]).abs().max() > 1e-3 and (v_uncond - want[1]).abs().max() > 1e-3


def test_a_hand_off_without_the_image_rows_is_refused_naming_it(parts, payload):
    without = {k: v for k, v in payload.items() if k != "embed.prefill"}
    with pytest.raises(ValueError, match="image: hunyuan_image_context: a prompt with images"):
        HunyuanImageContext().to_diffusion_input(without)
    cut = {**payload, "ids.prompt": payload["ids.prompt"][:2]}  # the block is not in it
    cut["embed.prefill"] = payload["embed.prefill"][:2]
    with pytest.raises(ValueError, match="image: the context does not hold"):
        _conditions(parts[1], cut)


def test_an_answer_cut_before_its_boi_is_drawn_after_what_it_wrote(parts, payload):
    """Not cut at the input image's `<boi>` (the last one in the context then)."""
    written = [104, 105, 33]
    cut = {**payload, "ids.output": torch.tensor(written)}
    (cond,) = _conditions(parts[1], cut)
    tail = [
        IDS["<answer>"],
        IDS["<boi>"],
        IDS[f"<img_size_{IMAGE_BASE_SIZE}>"],
        IDS["<img_ratio_12>"],
    ]
    assert cond.context == FIXTURE["prompt"] + written + tail


def test_blocks_of_several_images_are_found_in_order(parts):
    from omnistage.families.hunyuan_image3.edit_context import find_blocks

    pipe = parts[1]
    tokens, base, down = pipe.tokens, pipe.base, pipe.vae_down
    sizes = resolution_group(base)

    def block(ratio: int, vit_rows: int) -> list[int]:
        h, w = (s // down for s in sizes[ratio])
        head = [tokens.boi, tokens.size, tokens.ratios[ratio], IDS["<timestep>"]]
        return head + [tokens.img] * (h * w) + [tokens.joint_img_sep] + [tokens.img] * vit_rows

    first, second = block(12, 6) + [tokens.eoi], block(16, 4) + [tokens.eoi]
    ids = [5] + first + [6, 7] + second + [8]
    grids = torch.tensor([[1, 2, 3], [1, 2, 2]])
    a, b = find_blocks(ids, grids, tokens, base, down)
    h, w = (s // down for s in sizes[12])
    assert (a.vae.start, a.vae.height, a.vae.width) == (5, h, w)
    assert (a.vit.start, a.vit.height, a.vit.width, a.end) == (6 + h * w, 2, 3, len(first))
    at = 1 + len(first) + 2
    assert b.vae.start == at + 4 and b.end == at + len(second) - 1 and b.span[0] == at + 4
    with pytest.raises(ValueError, match="image: the input image's block is not laid out"):
        find_blocks([5, *block(12, 6)[:-8]], grids[:1], tokens, base, down)  # no separator
