"""HunyuanImage-3 conditioning-image sizes against the Instruct reference's image processor
(`tests/fixtures/hunyuan_image3/resize.json`, made by `make_resize_fixture.py`): its
resolution groups (align 16, the four extra sizes), the size, ratio index and resized
pixels of input images of several shapes; and the refusal, up front and naming `image`,
of input images on checkpoints whose base size the reference cannot lay out (64, 128:
the regression of a 40 x 56 image crashing inside the VAE encoder at the stage).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from omnistage.families.hunyuan_image3.config import HunyuanImage3Config
from omnistage.families.hunyuan_image3.image_input import vae_pixels
from omnistage.families.hunyuan_image3.input_encoder import HunyuanImage3InputEncoder
from omnistage.families.hunyuan_image3.resolution import ratio_index, resolution_group
from omnistage.families.hunyuan_image3.tiny import TINY_CONFIG, make_tiny_hunyuan_image3
from omnistage.pipeline.deploy import packaged_deploy_path
from omnistage.pipeline.omni import Omni

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "hunyuan_image3" / "resize.json").read_text()
)
IMAGE_SEED = 11  # make_resize_fixture.IMAGE_SEED


def test_resolution_groups_are_the_references():
    assert FIXTURE["groups"], "the fixture holds no group"
    for base, sizes in FIXTURE["groups"].items():
        assert resolution_group(int(base)) == [tuple(s) for s in sizes], base
    # the extra sizes are drawable sizes too, by their index
    assert ratio_index(256, 768, 1024) == 35


def test_input_images_are_resized_as_the_reference():
    rng = np.random.RandomState(IMAGE_SEED)
    for case in FIXTURE["images"]:
        array = rng.randint(0, 256, (*case["input_hw"], 3)).astype(np.uint8)
        ratio, pixels = vae_pixels(Image.fromarray(array), case["base"])
        assert ratio == case["ratio_index"], case
        assert list(pixels.shape) == [1, 3, *case["size_hw"]], case
        rgb = ((pixels[0] * 0.5 + 0.5) * 255).round().byte().permute(1, 2, 0).contiguous()
        assert hashlib.sha256(rgb.numpy().tobytes()).hexdigest() == case["sha256"], case


@pytest.mark.parametrize("base", [64, 128])
def test_small_bases_take_no_image(base):
    assert str(base) in FIXTURE["refused"]  # the reference cannot build its group either
    config = HunyuanImage3Config(**{**TINY_CONFIG, "image_base_size": base})
    config.model_type = HunyuanImage3InputEncoder.model_type
    assert HunyuanImage3InputEncoder.supported_modalities(config) == frozenset()
    image = Image.fromarray(np.zeros((40, 56, 3), np.uint8))
    with pytest.raises(ValueError, match=f"image: .*image_base_size {base}"):
        vae_pixels(image, base)
    config.image_base_size = 256
    assert HunyuanImage3InputEncoder.supported_modalities(config) == frozenset({"image"})


def test_an_image_on_a_base_64_checkpoint_is_refused_before_any_stage(tmp_path):
    path = make_tiny_hunyuan_image3(tmp_path / "hy3", image_base_size=64)
    spec = yaml.safe_load(packaged_deploy_path("demo-hunyuan-image3").read_text())
    spec["stages"], spec["edges"] = spec["stages"][:1], []
    image = np.random.RandomState(0).randint(0, 256, (40, 56, 3)).astype(np.uint8)
    parts = [{"type": "image", "image": image}, {"type": "text", "text": "what?"}]
    chat = {"messages": [{"role": "user", "content": parts}]}
    with Omni(spec, model=str(path), in_process=True) as omni:
        with pytest.raises(ValueError, match="image: this model does not accept image"):
            omni.generate([chat])
        assert not any(any(c.values()) for c in omni.stage_counters().values())
