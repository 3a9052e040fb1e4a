"""A request's per-model options on the server: the `extra_args` object of chat completions,
`/v1/images/generations` and (a JSON string in the form) `/v1/images/edits`.

    {"model": "demo-bagel", "messages": [...], "modalities": ["text", "image"],
     "extra_args": {"think": true, "cfg_img_scale": 1.5}}

The name is vLLM-Omni's: its servers take a model's own per-request switches (Bagel's
`think`, `cfg_text_scale`, `cfg_img_scale`, ...; HunyuanImage-3's `bot_task`) in an
`extra_args` object (`diffusion_request_utils.normalize_diffusion_request_args`; its
older name `extra_params` is deprecated there), which it lays into every stage's
`SamplingParams.extra_args`. vLLM's own server calls its container `vllm_xargs` (also
into `SamplingParams.extra_args`). vLLM-Omni also takes the declared names as top-level
fields; our requests refuse unknown fields, so only the object is read. HunyuanImage-3's
`bot_task` is a variable of its chat template here, so it comes in
`chat_template_kwargs` (vLLM's field), as the offline prompt's.

Each option goes to the stage that declares it, as offline code passes them: the entry
stage's prompter (`model_options` on it: Bagel's understanding stage, `think`) gets it in
`SamplingParams.model_options`, the draw stage's model (`DiffusionLimits.option_names`:
Bagel's `cfg_img_scale`, `cfg_interval`, `cfg_renorm_type`, `cfg_renorm_min`,
`timestep_shift`) in `DiffusionParams.model_options`. A name no stage declares is a 400
naming it (a text model takes none); a bad value is refused by the stage that reads it,
a 400 naming the option, before anything runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omnistage.entrypoints.openai.errors import OpenAIError


@dataclass(frozen=True)
class ModelOptions:
    """A request's `extra_args`, split by the stage that reads each."""

    entry: dict[str, Any] = field(default_factory=dict)
    """The entry stage's `SamplingParams.model_options`."""
    draw: dict[str, Any] = field(default_factory=dict)
    """The draw stage's `DiffusionParams.model_options`."""


def declared_options(client: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the entry stage's option names, the draw stage's) of the served model; a text model
    (no deploy) takes none."""
    deploy = getattr(client, "deploy", None)
    if deploy is None:
        return (), ()
    from omnistage.models import registry
    from omnistage.pipeline.deploy import model_type_of

    (entry,) = deploy.entry_stages
    stage = entry.with_part_directory()
    model = stage.model
    prompter = (
        registry.stage_prompter_class(model_type_of(model), stage.model_part) if model else None
    )
    limits = getattr(client, "diffusion_limits", None)
    return tuple(getattr(prompter, "model_options", ())), tuple(getattr(limits, "option_names", ()))


def read_extra_args(value: Any, client: Any, name: str = "extra_args") -> ModelOptions:
    """The request's options (`value`: its `extra_args` object, None: none) split by stage;
    a 400 naming `name` for anything but an object, naming the option for one the model
    does not take."""
    if value is None:
        return ModelOptions()
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise OpenAIError(f"{name}: expected an object of option names to values", param=name)
    entry, draw = declared_options(client)
    for option in value:
        if option not in entry and option not in draw:
            takes = ", ".join((*entry, *draw))
            what = f"it takes {takes}" if takes else "it takes no per-request options"
            raise OpenAIError(
                f"{option}: not an option of this model ({name}); {what}", param=option
            )
    return ModelOptions(
        {k: v for k, v in value.items() if k in entry},
        {k: v for k, v in value.items() if k in draw},
    )


def form_extra_args(fields: Mapping[str, Any], client: Any) -> ModelOptions:
    """A multipart form's options: `extra_args`, or its older name here `model_options`, a
    JSON object as a string; both at once, or one that is no JSON object, a 400 naming it."""
    given = [k for k in ("extra_args", "model_options") if fields.get(k) not in (None, "")]
    if len(given) > 1:
        raise OpenAIError(
            "extra_args: give extra_args or its older name model_options, not both",
            param="extra_args",
        )
    if not given:
        return ModelOptions()
    try:
        options = json.loads(fields[given[0]])
    except (TypeError, ValueError):
        options = None
    if not isinstance(options, dict):
        raise OpenAIError(f"{given[0]}: expected a JSON object", param=given[0])
    return read_extra_args(options, client, given[0])
