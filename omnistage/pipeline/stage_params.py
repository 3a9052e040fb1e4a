"""A request's per-stage parameters, read and checked in the frontend before any stage runs.

`sampling_params` may be one `SamplingParams` (for the entry stage), one
`DiffusionParams` (for the pipeline's diffusion stage), or a mapping of stage
name to either, each of the kind its stage takes. The parameters of every
diffusion stage (the request's over the stage's `default_sampling`) are
resolved against the limits of the stage's model here: a size it cannot
draw, steps < 1, guidance < 0 or a prompt too long for its text encoder is a
`ValueError` naming the field, and the resolved `[height, width]` travels
with the request (a prior whose prompt states the size needs it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omnistage.diffusion.model import DiffusionLimits, diffusion_model_class
from omnistage.diffusion.params import DiffusionParams
from omnistage.models.loader import resolve_model
from omnistage.pipeline.deploy import DeploySpec
from omnistage.pipeline.processors import stage_writes_text
from omnistage.sampling_params import SamplingParams

StageParams = SamplingParams | DiffusionParams
SamplingArg = StageParams | Mapping[str, StageParams] | None


def sampling_fields(params: SamplingParams) -> dict[str, Any]:
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params) if f.init}


@dataclass
class RequestParams:
    per_stage: dict[str, dict[str, Any]]
    """Stage name -> the fields the request sets for it (stages not named use defaults)."""
    image_size: list[int] | None
    """`[height, width]` the pipeline's diffusion stage will draw; None if it draws none."""


class StageParamsReader:
    def __init__(self, deploy: DeploySpec) -> None:
        self.deploy = deploy
        self.limits: dict[str, DiffusionLimits] = {}
        for stage in deploy.stages:
            if stage.kind == "diffusion" and stage.model is not None:
                path = resolve_model(stage.model).path
                self.limits[stage.name] = diffusion_model_class(path).read_limits(path)

    def read(self, sampling_params: SamplingArg, prompt: str | None) -> RequestParams:
        (entry,) = self.deploy.entry_stages
        per_stage = self._by_stage(sampling_params, entry.name)
        stages = {s.name: s for s in self.deploy.stages}
        fields: dict[str, dict[str, Any]] = {}
        for name, params in per_stage.items():
            if name not in stages:
                raise ValueError(
                    f"sampling_params: no stage named {name!r}; stages: {sorted(stages)}"
                )
            wanted = DiffusionParams if stages[name].kind == "diffusion" else SamplingParams
            if not isinstance(params, wanted):
                raise ValueError(
                    f"sampling_params[{name!r}]: stage {name!r} ({stages[name].kind}) takes "
                    f"{wanted.__name__}, got {type(params).__name__}"
                )
            if isinstance(params, SamplingParams):
                if params.n != 1 and len(stages) > 1:
                    raise ValueError("n: multi-stage pipelines generate one sequence per request")
                if params.stop_strings and not stage_writes_text(self.deploy, name):
                    raise ValueError(
                        f"sampling_params[{name!r}].stop: stage {name!r} writes no text; stop "
                        "strings apply only to stages that do"
                    )
                fields[name] = sampling_fields(params)
            else:
                fields[name] = params.to_fields()
        image_size = None
        for name, limits in self.limits.items():
            stage = stages[name]
            merged = DiffusionParams.from_fields({**stage.default_sampling, **fields.get(name, {})})
            resolved = limits.resolve(merged, 0)
            if prompt is not None:
                limits.check_prompt(prompt)
            limits.check_prompt(resolved.negative_prompt, "negative_prompt")
            image_size = [resolved.height, resolved.width]
        return RequestParams(fields, image_size)

    def _by_stage(self, sampling_params: SamplingArg, entry: str) -> dict[str, StageParams]:
        if sampling_params is None:
            return {}
        if isinstance(sampling_params, SamplingParams):
            return {entry: sampling_params}
        if isinstance(sampling_params, DiffusionParams):
            if len(self.limits) != 1:
                raise ValueError(
                    "sampling_params: DiffusionParams alone needs a pipeline with one diffusion "
                    "stage; give {stage name: params}"
                )
            return {next(iter(self.limits)): sampling_params}
        if isinstance(sampling_params, Mapping):
            return dict(sampling_params)
        raise ValueError(
            "sampling_params: expected SamplingParams, DiffusionParams or {stage name: params}"
        )
