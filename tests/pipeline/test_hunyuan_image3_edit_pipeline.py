"""HunyuanImage-3 image editing end to end on a tiny float64 checkpoint
(`demo-hunyuan-image3`'s deploy): a chat with an input image goes through the thinker
(the image's joint block in its prompt), the edge hands the draw stage the context's ids,
the prompt's input rows and the image grid, and the draw stage denoises after the image.

- answers cut before their `<boi>` (max_tokens) are drawn after what they wrote, not
  cut at the input image's own `<boi>`;
- sync == async scheduling of the thinker, alone == batched with a text-only request:
  the same tokens and the same image bytes;
- (that the input image matters is checked in tests/models/test_hunyuan_image3_edit.py
  and the server's edits test);
- bad input (an image Pillow cannot decode, one over the pixel bound) is a ValueError
  naming `image`, before any stage runs.

Base size 256, the smallest whose resolution group the reference can lay input images
out in (`resolution.py`); drawn at 128 x 384 (8 x 24 latent tokens). The input images
are 20 x 60 and 60 x 20, resized to the group's smallest sizes, 128 x 384 and 384 x 128.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import yaml
from PIL import Image

from omnistage.diffusion.params import DiffusionParams
from omnistage.families.hunyuan_image3.tiny import make_tiny_hunyuan_image3, token_ids
from omnistage.pipeline.deploy import packaged_deploy_path
from omnistage.pipeline.omni import Omni

DRAW = {"height": 128, "width": 384, "num_inference_steps": 2, "guidance_scale": 2.5}
IDS = token_ids()
RNG = np.random.RandomState(3)
IMAGES = [RNG.randint(0, 256, hw + (3,)).astype(np.uint8) for hw in ((20, 60), (60, 20))]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_hunyuan_image3(tmp_path_factory.mktemp("hy3e"), seed=0)


def deploy(async_scheduling: bool) -> dict:
    spec = yaml.safe_load(packaged_deploy_path("demo-hunyuan-image3").read_text())
    for stage in spec["stages"]:
        stage["engine_args"]["dtype"] = "float64"
    spec["stages"][0]["engine_args"]["async_scheduling"] = async_scheduling
    spec["stages"][0]["default_sampling"]["max_tokens"] = 8  # cut in the thought
    return spec


def edit(image, text: str) -> dict:
    parts = [{"type": "image", "image": image}, {"type": "text", "text": text}]
    return {"messages": [{"role": "user", "content": parts}]}


CHATS = [
    edit(IMAGES[0], "make it red"),
    {"messages": [{"role": "user", "content": "a red bicycle"}]},
    edit(IMAGES[1], "add a hat"),
]


def generate(omni: Omni, chats: list[dict], seeds: list[int]) -> list[tuple[list[int], bytes]]:
    params = [DiffusionParams(**DRAW, seed=s) for s in seeds]
    outs = omni.generate(chats, params)
    assert all(o.error is None for o in outs), [o.error for o in outs]
    assert all(not any(c.values()) for c in omni.stage_counters().values())
    return [(o.outputs["thinker"].token_ids, o.image_array.tobytes()) for o in outs]


@pytest.fixture(scope="module")
def sync(ckpt):
    with Omni(deploy(False), model=str(ckpt), in_process=True) as omni:
        return generate(omni, CHATS, [0, 1, 2])


@pytest.fixture(scope="module")
def omni(ckpt):
    with Omni(deploy(True), model=str(ckpt), in_process=True) as omni:
        yield omni


def test_edits_are_the_same_sync_async_alone_batched(sync, omni):
    assert generate(omni, CHATS, [0, 1, 2]) == sync
    assert generate(omni, CHATS[2:], [2]) == sync[2:]  # alone
    images = [np.frombuffer(image, np.uint8) for _, image in sync]
    assert all(image.size == 128 * 384 * 3 and image.std() > 0 for image in images)
    # Cut before its own <boi>: the image is drawn after <answer><boi> appended to what
    # it wrote, not cut at the input image's <boi> (which would drop the image's block).
    assert all(IDS["<boi>"] not in tokens for tokens, _ in sync)


def _png(shape) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.zeros(shape, np.uint8)).save(out, format="PNG")
    return out.getvalue()


def test_bad_images_are_refused_naming_the_field(omni, monkeypatch):
    with pytest.raises(ValueError, match="image: cannot decode"):
        omni.generate([edit(b"not an image", "x")], DiffusionParams(**DRAW))
    monkeypatch.setenv("OMNISTAGE_MAX_IMAGE_PIXELS", "1000")
    with pytest.raises(ValueError, match="image: .*1000"):
        omni.generate([edit(_png((40, 40, 3)), "x")], DiffusionParams(**DRAW))
    assert all(not any(c.values()) for c in omni.stage_counters().values())
