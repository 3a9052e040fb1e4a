"""Bagel's per-request draw options (`DiffusionParams.model_options`) are checked before any
stage runs, each bad value a ValueError naming its option; a model that takes no options
refuses any, naming it."""

from __future__ import annotations

import pytest

from omnistage.diffusion.model import DiffusionLimits
from omnistage.diffusion.params import DiffusionParams
from omnistage.families.bagel.flow import read_options, settings_of


def test_defaults_are_the_inferencers_text_to_image_settings():
    options = read_options({}, 3.0)
    assert options == {
        "cfg_img_scale": 1.0,
        "cfg_interval": [0.4, 1.0],
        "cfg_renorm_min": 0.0,
        "cfg_renorm_type": "global",
        "timestep_shift": 3.0,
    }
    settings = settings_of(read_options({"cfg_img_scale": 2, "cfg_interval": (0, 1)}, 1.0))
    assert settings.img_scale == 2.0 and settings.interval == (0.0, 1.0)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"cfg_img_scale": -1.0}, "cfg_img_scale"),
        ({"cfg_img_scale": True}, "cfg_img_scale"),
        ({"cfg_interval": [0.6, 0.2]}, "cfg_interval"),
        ({"cfg_interval": [0.0]}, "cfg_interval"),
        ({"cfg_interval": "all"}, "cfg_interval"),
        ({"cfg_renorm_type": "none"}, "cfg_renorm_type"),
        ({"cfg_renorm_min": 1.5}, "cfg_renorm_min"),
        ({"timestep_shift": 0}, "timestep_shift"),
        ({"timestep_shift": float("nan")}, "timestep_shift"),
        ({"cfg_text_scale": 2.0}, "cfg_text_scale"),
    ],
)
def test_bad_option_names_its_field(options, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        read_options(options, 3.0)


def test_a_model_without_options_refuses_them():
    limits = DiffusionLimits(16, 16, 2, 1.0, 16, 64, 16, 77, len)
    params = DiffusionParams(model_options={"cfg_img_scale": 2.0})
    with pytest.raises(ValueError, match="^cfg_img_scale:"):
        limits.resolve(params, 0)
    assert limits.resolve(DiffusionParams(), 0).model_options == {}
    with pytest.raises(ValueError, match="^model_options:"):
        DiffusionParams(model_options=[("a", 1)])


def test_options_travel_as_fields():
    params = DiffusionParams(model_options={"timestep_shift": 2.0})
    assert params.to_fields() == {"model_options": {"timestep_shift": 2.0}}
    assert DiffusionParams().to_fields() == {}
    assert DiffusionParams.from_fields(params.to_fields()) == params
