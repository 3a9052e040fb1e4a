"""`DiffusionEngine`: continuous batching of denoising loops, one step at a time.

Requests arrive with their prompt, resolved parameters and (for models that
need them) prior tokens. They wait until there is room (`max_num_seqs`
running), then are admitted together: their prompts encoded, their own noise
scheduler each, their initial noise from their own seed.

Every `step()` runs one denoising step for one batch: the running requests of
the oldest request's kind (equal height, width and step count), oldest
first, up to `max_batch`, at whatever step each has reached (their
timesteps go along per row). Each request's latents move with its own
scheduler, and no request's floats depend on its neighbours (a batched GEMM
sums in an order chosen by the batch's size): prompts are encoded one request
per call; the denoising model and the decoder run either one request per call
or, for small latents (and, for denoising, a model that supports it), on the
whole batch padded to a fixed row count (`2 * max_batch` rows to denoise,
`max_batch` to decode: every call has the same shape, so each row is computed
the same way whoever shares it — batching is where a tiny model's throughput
comes from). A request's image therefore depends only
on its prompt, parameters and seed — bit for bit, whatever shared its steps or
when it joined. A request whose last step ran is decoded and leaves the
engine.

`abort(request_id)` forgets a request wherever it is; nothing else holds it.

A model call that raises is pinned on its request: encoding runs one request per call
already, and a batched denoising or decoding call that fails runs again one request per
call (the rows being independent, those that pass get the very floats the batch would
have given them). A request whose own call fails leaves the engine with an error event;
the others go on.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from omnistage.diffusion.model import DiffusionInput, DiffusionModel
from omnistage.diffusion.params import ResolvedDiffusionParams

logger = logging.getLogger(__name__)

PADDED_LATENT_LIMIT = 4096
"""Largest latent (elements per request; 256x256 pixels through an 8x, 4-channel VAE) whose
batches run padded in one call. Above it a request's own rows fill the GEMMs and one call per
request costs little."""


@dataclass
class _Running:
    request_id: str
    prompt: str
    params: ResolvedDiffusionParams
    order: int
    condition: Any
    scheduler: Any
    latents: torch.Tensor
    step: int = 0

    @property
    def num_steps(self) -> int:
        return len(self.scheduler.timesteps)


@dataclass
class DiffusionEvent:
    """What a step did for one request: a step done (`image` None) or its image."""

    request_id: str
    prompt: str
    step: int
    """Denoising steps done so far."""
    num_steps: int
    image: torch.Tensor | None = None
    """`[H, W, 3]` uint8 when the request finished."""
    progress: bool = False
    """The request asked for per-step progress events."""
    error: str | None = None
    """The model failed on this request (its own call raised): it has left the engine."""

    @property
    def finished(self) -> bool:
        return self.image is not None


class DiffusionEngine:
    def __init__(self, model: DiffusionModel, max_num_seqs: int, max_batch: int | None = None):
        if max_num_seqs < 1:
            raise ValueError("max_num_seqs: expected an integer >= 1")
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.max_batch = max_batch or max_num_seqs
        self.waiting: deque[tuple[str, DiffusionInput, int]] = deque()
        self.running: dict[str, _Running] = {}
        self._order = itertools.count()
        self.num_steps_run = 0
        """Batched denoising steps run (one transformer call each)."""

    def add_request(self, request_id: str, item: DiffusionInput) -> None:
        if request_id in self.running or any(r == request_id for r, _, _ in self.waiting):
            raise ValueError(f"request_id: {request_id!r} is already in use")
        if self.model.needs_prior_tokens and item.prior_token_ids is None:
            raise ValueError(f"request {request_id!r}: this model needs prior tokens")
        self.waiting.append((request_id, item, next(self._order)))

    def abort(self, request_id: str) -> None:
        self.running.pop(request_id, None)
        if any(r == request_id for r, _, _ in self.waiting):
            self.waiting = deque(w for w in self.waiting if w[0] != request_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def request_ids(self) -> list[str]:
        """Every request held, running or waiting to be admitted."""
        return [*self.running, *(r for r, _, _ in self.waiting)]

    def counters(self) -> dict[str, int]:
        return {"waiting_requests": len(self.waiting), "running_requests": len(self.running)}

    # -- stepping ---------------------------------------------------------------------------
    def _admit(self, failed: dict[str, tuple[str, str]]) -> None:
        room = self.max_num_seqs - len(self.running)
        admitted = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
        for request_id, item, order in admitted:
            # One request per call (as decode below): a batched call's GEMMs and
            # convolutions would sum in an order chosen by the batch size.
            try:
                condition = self.model.encode([item])[0]
            except Exception as exc:
                failed[request_id] = (item.prompt, _failure(request_id, exc))
                continue
            self.running[request_id] = _Running(
                request_id=request_id,
                prompt=item.prompt,
                params=item.params,
                order=order,
                condition=condition,
                scheduler=self.model.new_scheduler(item.params),
                latents=self.model.initial_latents(item.params),
            )

    def _each(
        self,
        batch: list[_Running],
        call: Callable[[list[_Running], list[int]], Sequence[Any]],
        failed: dict[str, tuple[str, str]],
    ) -> dict[str, Any]:
        """`call(batch, rows)`'s result per request; when the batched call raises, each
        request alone (those whose own call raises go to `failed` and leave `running`)."""
        try:
            results = call(batch, list(range(len(batch))))
            return {r.request_id: results[i] for i, r in enumerate(batch)}
        except Exception as exc:
            if len(batch) == 1:
                self._fail(batch[0], exc, failed)
                return {}
        alone = {}
        for i, request in enumerate(batch):
            try:
                alone[request.request_id] = call([request], [i])[0]
            except Exception as exc:
                self._fail(request, exc, failed)
        return alone

    def _fail(self, request: _Running, exc: Exception, failed: dict[str, tuple[str, str]]) -> None:
        failed[request.request_id] = (request.prompt, _failure(request.request_id, exc))
        del self.running[request.request_id]

    def _next_batch(self) -> list[_Running]:
        oldest = min(self.running.values(), key=lambda r: r.order)
        same = [r for r in self.running.values() if r.params.batch_key == oldest.params.batch_key]
        return sorted(same, key=lambda r: r.order)[: self.max_batch]

    def _predict(self, batch: list[_Running], timesteps: torch.Tensor) -> torch.Tensor:
        if self.model.supports_padded_rows and batch[0].latents.numel() <= PADDED_LATENT_LIMIT:
            return self.model.predict(
                torch.cat([r.latents for r in batch]),
                timesteps,
                [r.condition for r in batch],
                [r.params.guidance_scale for r in batch],
                pad_rows_to=2 * self.max_batch,
            )
        return torch.cat(
            [
                self.model.predict(
                    r.latents, timesteps[i : i + 1], [r.condition], [r.params.guidance_scale]
                )
                for i, r in enumerate(batch)
            ]
        )

    def _decode(self, done: list[_Running]) -> list[torch.Tensor]:
        if done[0].latents.numel() <= PADDED_LATENT_LIMIT:  # one call of max_batch rows
            latents = [r.latents for r in done]
            latents += latents[:1] * (self.max_batch - len(done))
            return list(self.model.decode(torch.cat(latents))[: len(done)])
        return [self.model.decode(r.latents)[0] for r in done]

    def step(self) -> list[DiffusionEvent]:
        failed: dict[str, tuple[str, str]] = {}
        self._admit(failed)
        events = self._denoise(failed) if self.running else []
        for request_id, (prompt, message) in failed.items():
            events.append(DiffusionEvent(request_id, prompt, 0, 0, error=message))
        return events

    def _denoise(self, failed: dict[str, tuple[str, str]]) -> list[DiffusionEvent]:
        """One denoising step of the next batch, and the images of those it finished."""
        batch = self._next_batch()
        timesteps = torch.stack([r.scheduler.timesteps[r.step] for r in batch])
        pred = self._each(batch, lambda b, rows: self._predict(b, timesteps[rows]), failed)
        self.num_steps_run += 1
        batch = [r for r in batch if r.request_id in pred]
        for request in batch:
            request.latents = request.scheduler.step(
                pred[request.request_id].unsqueeze(0),
                request.scheduler.timesteps[request.step],
                request.latents,
                return_dict=False,
            )[0]
            request.step += 1
        done = [r for r in batch if r.step >= r.num_steps]
        images = self._each(done, lambda b, rows: self._decode(b), failed) if done else {}
        events = []
        for request in batch:
            if request.request_id in failed:
                continue
            finished = request.step >= request.num_steps
            image = images[request.request_id] if finished else None
            if finished:
                del self.running[request.request_id]
            if finished or request.params.progress:
                events.append(
                    DiffusionEvent(
                        request.request_id,
                        request.prompt,
                        request.step,
                        request.num_steps,
                        image,
                        request.params.progress,
                    )
                )
        return events


def _failure(request_id: str, exc: Exception) -> str:
    logger.exception("diffusion: the model failed on request %s", request_id)
    return f"{type(exc).__name__}: {exc}"
