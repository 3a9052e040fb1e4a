"""`DiffusionModel`: the contract between a diffusion stage and the components it runs.

A diffusion checkpoint is a diffusers-layout directory: `model_index.json`
naming the pipeline class (`_class_name`) and one sub-directory per component
(`transformer/`, `vae/`, `scheduler/`, `text_encoder/`, `tokenizer/` ...).
`load_diffusion_model` picks the `DiffusionModel` subclass registered for that
class name, which loads the components (wrapping diffusers and transformers
modules) and answers the stage's questions:

- **before any stage runs** (`resolve`, `check_prompt`): fill in the model's
  defaults and reject sizes it cannot draw, steps < 1, guidance < 0 and prompts
  too long for its text encoder, each a `ValueError` naming the field;
- **when a request is admitted** (`encode`, `new_scheduler`, `initial_latents`):
  its conditioning (positive and, with guidance, negative), its own noise
  scheduler with its timesteps set, and its initial noise drawn from a
  generator seeded with the request's seed alone, so a request's image does not
  depend on what else is in the batch;
- **every step** (`predict`): the guided noise (or velocity) prediction of a
  batch of requests of equal size and step count in one transformer call, the
  unconditional rows of requests using guidance appended to the batch;
- **at the end** (`decode`): latents to `[B, H, W, 3]` uint8 pixels.

The engine (`omnistage.diffusion.engine`) owns the batching, the schedulers'
`step` and the request lifecycle; models own only the math.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from omnistage.diffusion.params import DiffusionParams, ResolvedDiffusionParams
from omnistage.models import registry

MODEL_INDEX = "model_index.json"


@dataclass
class DiffusionInput:
    """One request as the model sees it when it is admitted."""

    prompt: str
    """The text to draw (a caption from an upstream stage, or the user's prompt)."""
    params: ResolvedDiffusionParams
    prior_token_ids: torch.Tensor | None = None
    """Tokens from an upstream autoregressive stage that condition the image (GLM-Image's
    prior tokens: every token the prior generated, in order); None for text-only models."""
    kv_context: Any = None
    """The KV cache an upstream autoregressive stage prefilled, as its edge processor hands
    it over (Bagel: `edges.BagelHandOff`); None where no stage hands one."""
    hand_off: Any = None
    """Anything else an upstream stage's edge hands over (HunyuanImage-3: its input images'
    rows, `edges.HunyuanImageHandOff`); None where no edge hands more than ids."""


@dataclass(frozen=True)
class DiffusionLimits:
    """What a diffusion model can draw: its defaults, sizes and text-encoder length. The
    frontend checks every request against these before any stage runs."""

    default_height: int
    default_width: int
    default_steps: int
    default_guidance: float
    min_size: int
    max_size: int
    size_multiple: int
    """Heights and widths must be multiples of this (VAE scale x patch size)."""
    max_text_tokens: int
    count_text_tokens: Callable[[str], int]
    """How many text-encoder tokens a prompt is."""
    check_options: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    """The model's `DiffusionParams.model_options` checked, defaults filled in (ValueError
    naming the option); None: the model takes none."""
    option_names: tuple[str, ...] = ()
    """The names of the options `check_options` takes (the server routes a request's
    `extra_args` by them)."""

    def resolve(self, params: DiffusionParams, default_seed: int) -> ResolvedDiffusionParams:
        """`params` with the defaults filled in; ValueError naming the field when the model
        cannot honour them."""
        height = self.default_height if params.height is None else params.height
        width = self.default_width if params.width is None else params.width
        self.check_size(height, width)
        steps = (
            self.default_steps if params.num_inference_steps is None else params.num_inference_steps
        )
        guidance = self.default_guidance if params.guidance_scale is None else params.guidance_scale
        return ResolvedDiffusionParams(
            height=height,
            width=width,
            num_inference_steps=steps,
            guidance_scale=guidance,
            seed=default_seed if params.seed is None else params.seed,
            negative_prompt=params.negative_prompt,
            progress=params.progress,
            model_options=self.resolve_options(params.model_options),
        )

    def resolve_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        if self.check_options is not None:
            return self.check_options(options)
        if options:
            raise ValueError(f"{next(iter(options))}: this model takes no such parameter")
        return {}

    def check_size(self, height: int, width: int) -> None:
        for name, value in (("height", height), ("width", width)):
            if not self.min_size <= value <= self.max_size or value % self.size_multiple:
                raise ValueError(
                    f"{name}: {value} is not supported; this model draws sizes from "
                    f"{self.min_size} to {self.max_size} in multiples of {self.size_multiple}"
                )

    def check_prompt(self, prompt: str, field: str = "prompt") -> None:
        """ValueError naming `field` when the text encoder cannot take `prompt`."""
        n = self.count_text_tokens(prompt)
        if n > self.max_text_tokens:
            raise ValueError(
                f"{field}: {n} text-encoder tokens; this model's text encoder takes at most "
                f"{self.max_text_tokens}"
            )


class DiffusionModel(ABC):
    """Base class: subclasses load their components and implement the math."""

    pipeline_class_names: ClassVar[tuple[str, ...]] = ()
    """`model_index.json` `_class_name` values this class loads."""

    needs_prior_tokens: ClassVar[bool] = False
    """Whether requests must bring `prior_token_ids` (from an upstream AR stage)."""

    supports_padded_rows: ClassVar[bool] = False
    """Whether `predict` takes `pad_rows_to` (batched calls of one fixed shape)."""

    default_height: int = 1024
    default_width: int = 1024
    default_steps: int = 50
    default_guidance: float = 1.0
    min_size: int = 16
    max_size: int = 2048
    size_multiple: int = 16
    """Heights and widths must be multiples of this (VAE scale x patch size)."""
    max_text_tokens: int = 512
    """The longest prompt (in text-encoder tokens) the text encoder takes."""

    latent_channels: int = 4
    vae_scale: int = 8
    """How many pixels one latent covers in each direction."""
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32

    @classmethod
    @abstractmethod
    def load(cls, path: Path, dtype: torch.dtype, device: torch.device) -> DiffusionModel:
        """The model of the checkpoint directory `path`."""

    # -- checks before any stage runs ----------------------------------------------------------
    @property
    def limits(self) -> DiffusionLimits:
        """What this model can draw (from its attributes)."""
        return DiffusionLimits(
            default_height=self.default_height,
            default_width=self.default_width,
            default_steps=self.default_steps,
            default_guidance=self.default_guidance,
            min_size=self.min_size,
            max_size=self.max_size,
            size_multiple=self.size_multiple,
            max_text_tokens=self.max_text_tokens,
            count_text_tokens=self.count_text_tokens,
            check_options=self.check_options,
            option_names=self.option_names,
        )

    @classmethod
    def read_limits(cls, path: Path) -> DiffusionLimits:
        """The limits of the checkpoint at `path`, for the frontend's checks. This default
        loads the whole model; subclasses read only configs and the tokenizer."""
        return cls.load(path, torch.float32, torch.device("cpu")).limits

    def resolve(self, params: DiffusionParams, default_seed: int) -> ResolvedDiffusionParams:
        return self.limits.resolve(params, default_seed)

    def check_size(self, height: int, width: int) -> None:
        self.limits.check_size(height, width)

    def check_prompt(self, prompt: str, field: str = "prompt") -> None:
        self.limits.check_prompt(prompt, field)

    check_options: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    """`DiffusionLimits.check_options` (None: the model takes no `model_options`)."""
    option_names: ClassVar[tuple[str, ...]] = ()
    """`DiffusionLimits.option_names`."""

    @abstractmethod
    def count_text_tokens(self, prompt: str) -> int:
        """How many text-encoder tokens `prompt` is."""

    # -- per request --------------------------------------------------------------------------
    @abstractmethod
    def encode(self, inputs: list[DiffusionInput]) -> list[Any]:
        """Each request's conditioning (opaque to the engine, handed back to `predict`)."""

    @abstractmethod
    def new_scheduler(self, params: ResolvedDiffusionParams) -> Any:
        """A fresh diffusers noise scheduler for one request, its timesteps set."""

    def latent_shape(self, params: ResolvedDiffusionParams) -> tuple[int, ...]:
        """The shape of one request's latents, batch dimension excluded: `latent_channels`
        planes at `1 / vae_scale` of the image's height and width."""
        return (
            self.latent_channels,
            params.height // self.vae_scale,
            params.width // self.vae_scale,
        )

    def initial_latents(self, params: ResolvedDiffusionParams) -> torch.Tensor:
        """`[1, *latent_shape]` noise from a CPU generator seeded with the request's seed only
        (drawn in float32, then cast: the same on every device and dtype)."""
        generator = torch.Generator("cpu").manual_seed(params.seed)
        noise = torch.randn((1, *self.latent_shape(params)), generator=generator)
        return noise.to(self.device, self.dtype)

    # -- per step -----------------------------------------------------------------------------
    @abstractmethod
    def predict(
        self,
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        conditions: list[Any],
        guidance_scales: list[float],
        pad_rows_to: int = 0,
    ) -> torch.Tensor:
        """The guided model output for a batch (`[B, *latent_shape]`), requests of one size
        and step count, `timesteps` their schedulers' current timesteps (`[B]`). Requests
        with guidance scale > 1 run their unconditional branch in the same call. With
        `pad_rows_to` (only where `supports_padded_rows`), the model runs on exactly that
        many rows (conditional + unconditional, filled with copies): every call then has one
        shape, and a row's floats do not depend on the batch."""

    @abstractmethod
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Final latents `[B, *latent_shape]` to `[B, H, W, 3]` uint8 pixels."""


def pipeline_class_name(path: str | Path) -> str | None:
    """The `_class_name` of a diffusers-layout checkpoint, or None when `path` is not one."""
    index = Path(path) / MODEL_INDEX
    if not index.is_file():
        return None
    return json.loads(index.read_text()).get("_class_name")


def diffusion_model_class(path: str | Path) -> type[DiffusionModel]:
    name = pipeline_class_name(path)
    if name is None:
        raise ValueError(f"{path}: not a diffusion checkpoint (no {MODEL_INDEX})")
    cls = registry.diffusion_model_class(name)
    if cls is None:
        raise ValueError(
            f"{path}: diffusion pipeline {name!r} is not supported; supported: "
            f"{', '.join(registry.diffusion_pipeline_names())}"
        )
    return cls


def load_diffusion_model(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> DiffusionModel:
    return diffusion_model_class(path).load(Path(path), dtype, torch.device(device))
