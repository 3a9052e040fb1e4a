"""What the server reads from a pipeline's deploy: which deploy `omnistage serve` runs,
the entry (thinker) stage's context length, the room a prompt leaves in it, and the
per-stage sampling params of a request. Configuration only: no stage is asked.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from omnistage.pipeline.deploy_spec import DeploySpec, StageSpec
from omnistage.sampling_params import SamplingParams


def pipeline_deploy(
    model: str | None, deploy: str | os.PathLike | Mapping[str, Any] | DeploySpec | None
) -> DeploySpec | None:
    """The multi-stage deploy `omnistage serve` should run for `model` / `deploy`, or None
    when it is one text model (served by `AsyncEngineClient` as before)."""
    from omnistage.pipeline.deploy import deploy_for_model, load_deploy
    from omnistage.pipeline.omni import _deploy_source

    if deploy is not None:
        spec = deploy if isinstance(deploy, DeploySpec) else load_deploy(_deploy_source(deploy))
        return spec.with_model(model) if model is not None else spec
    if model is None:
        return None
    spec = deploy_for_model(model)
    return spec if spec.is_pipeline else None


def check_context(
    limit: int | None, num_prompt: int, max_tokens: int | None, clamp: bool
) -> int | None:
    """The room a context of `limit` tokens leaves after a prompt of `num_prompt` (None:
    no limit); ValueError when there is none, or less than `max_tokens` (unless `clamp`)."""
    if limit is None:
        return None
    if num_prompt >= limit:
        raise ValueError(
            f"prompt: the prompt ({num_prompt} tokens) leaves no room to generate "
            f"within the context length of {limit} tokens"
        )
    room = limit - num_prompt
    if max_tokens is not None and max_tokens > room and not clamp:
        raise ValueError(
            f"max_tokens: the prompt ({num_prompt} tokens) plus max_tokens ({max_tokens}) "
            f"exceeds the context length of {limit} tokens; at most {room} tokens can be "
            "generated"
        )
    return room


def stage_params(deploy: DeploySpec, params: SamplingParams, draw: Any = None) -> dict[str, Any]:
    """`params` for the entry stage; with a seed, every other sampling stage's defaults
    with that seed (a seeded request is reproducible end to end); `draw` (`DiffusionParams`,
    None: the defaults) for the stage that draws the final image."""
    (entry,) = deploy.entry_stages
    per_stage: dict[str, Any] = {entry.name: params}
    if draw is not None:
        per_stage |= {s.name: draw for s in deploy.final_stages if s.final_output_type == "image"}
    if params.seed is not None:
        for stage in deploy.stages:
            if stage.name != entry.name and stage.kind != "diffusion":
                seeded = {**stage.default_sampling, "seed": params.seed}
                per_stage[stage.name] = SamplingParams(**seeded)
    return per_stage


def seeded_params(deploy: DeploySpec, seed: int) -> dict[str, Any]:
    """Every sampling stage's deploy defaults with `seed` (a seeded request that brings no
    sampling parameters of its own)."""
    (entry,) = deploy.entry_stages
    return stage_params(deploy, SamplingParams(**{**entry.default_sampling, "seed": seed}))


def entry_max_model_len(entry: StageSpec) -> int | None:
    """The context length an `ar` stage's engine will have (`EngineConfig.resolve_for_model`
    over its checkpoint part's config), read from configuration only; None for other kinds
    or a stage without a model."""
    if entry.kind != "ar" or entry.model is None:
        return None
    from omnistage.config import EngineConfig
    from omnistage.engine.model_builder import model_max_len
    from omnistage.models.loader import load_hf_config, resolve_model
    from omnistage.models.parts import select_part
    from omnistage.models.registry import engine_config

    spec = entry.with_part_directory()
    hf_config = load_hf_config(resolve_model(spec.model))
    if spec.model_part is not None:
        hf_config = select_part(hf_config, spec.model_part)
    hf_config = engine_config(hf_config)
    configured = spec.engine_args.get("max_model_len")
    config = EngineConfig(model=spec.model, max_model_len=configured)
    return config.resolve_for_model(model_max_len(hf_config)).max_model_len
