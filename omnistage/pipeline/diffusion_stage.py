"""`DiffusionStageCore`: a stage that draws images with a `DiffusionEngine`.

A request starts from a prompt (the entry stage, or a `prompt` edge whose
processor made one, e.g. the caption a thinker wrote) or from a payload of
one incoming `payload` edge whose processor gives prior tokens (GLM-Image's
autoregressive prior), with the user's prompt alongside. Its parameters are
the request's `DiffusionParams` for this stage over the stage's
`default_sampling`, resolved against the model (the frontend has already
checked them; a caption written upstream is checked here, and a bad one fails
only its request). Without a seed, the seed is derived from the stage's
engine seed and the prompt, so a request is reproducible in any batch.

Outputs: with `progress`, one event per denoising step (`progress=[done,
total]`); then the image (`[H, W, 3]` uint8) with the prompt it drew as its
text, finishing the request.
"""

from __future__ import annotations

import hashlib
from typing import Any

from omnistage.config import EngineConfig
from omnistage.core.payload import Payload
from omnistage.core.tensor_blob import tensor_to_blob
from omnistage.diffusion.engine import DiffusionEngine
from omnistage.diffusion.model import DiffusionInput, load_diffusion_model
from omnistage.diffusion.params import DiffusionParams
from omnistage.models.loader import resolve_model
from omnistage.pipeline.deploy import DeploySpec, StageSpec
from omnistage.pipeline.messages import DeliverPayload, FromStage, StageOutput, SubmitRequest
from omnistage.pipeline.stage_core import StageCore
from omnistage.platforms import platform_for


class DiffusionStageCore(StageCore):
    def __init__(self, spec: StageSpec, deploy: DeploySpec, namespace: str) -> None:
        super().__init__(spec, deploy, namespace)
        if len(self.incoming) > 1:
            raise ValueError(
                f"stage {spec.name!r}: a diffusion stage takes at most one payload edge in, "
                f"got {len(self.incoming)}"
            )
        self.processor = None
        for edge, processor in self.incoming.values():
            if edge.transfer != "payload":
                raise ValueError(
                    f"stage {spec.name!r}: a diffusion stage takes its input whole "
                    f"(transfer: payload or prompt), not {edge.transfer!r}"
                )
            self.processor = processor
        config = EngineConfig(model=spec.model, **spec.engine_args)
        platform = platform_for(config.device)
        platform.configure_threads(config.num_threads)
        self.model = load_diffusion_model(
            resolve_model(config.model).path, config.torch_dtype, platform.device
        )
        self.engine = DiffusionEngine(self.model, config.max_num_seqs)
        self.engine_seed = config.seed

    def _add(self, msg: SubmitRequest, upstream: dict[str, Any] | None = None) -> None:
        prompt = msg.prompt
        if prompt is None:
            raise ValueError(f"stage {self.name!r}: the request has no prompt to draw")
        self.model.check_prompt(prompt)
        params = DiffusionParams.from_fields({**self.spec.default_sampling, **(msg.sampling or {})})
        resolved = self.model.resolve(params, derived_text_seed(self.engine_seed, prompt))
        self.engine.add_request(
            msg.request_id, DiffusionInput(prompt, resolved, **(upstream or {}))
        )

    def start(self, msg: SubmitRequest, payloads: dict[str, Payload] | None) -> list[FromStage]:
        if self.incoming:
            raise ValueError(
                f"stage {self.name!r} (diffusion) starts only from its input edge "
                f"{next(iter(self.incoming))!r}"
            )
        self._add(msg)
        return []

    def on_input(self, msg: DeliverPayload, payload: Payload) -> list[FromStage]:
        entry = self.coordinator.arrived(msg.request_id, msg.edge, payload, msg.last)
        if entry is None or entry.waiting_edges:
            return []
        self.coordinator.release(msg.request_id)
        self._add(entry.submit, self.processor.to_diffusion_input(entry.received[msg.edge]))
        return []

    def step(self) -> list[FromStage]:
        outputs: list[FromStage] = []
        for event in self.engine.step():
            if event.error is not None:  # the model failed on this request alone
                message = f"the step running this request failed: {event.error}"
                outputs += self._fail([event.request_id], message)
                continue
            outputs.append(
                StageOutput(
                    stage=self.name,
                    request_id=event.request_id,
                    new_text=event.prompt if event.finished else "",
                    data=tensor_to_blob(event.image) if event.finished else None,
                    progress=[event.step, event.num_steps] if event.progress else None,
                    finished=event.finished,
                    finish_reason="stop" if event.finished else None,
                )
            )
        return outputs

    def drop_request(self, request_id: str) -> None:
        self.engine.abort(request_id)

    def step_request_ids(self) -> list[str]:
        return self.engine.request_ids()

    def has_work(self) -> bool:
        return self.engine.has_work()

    def counters(self) -> dict[str, Any]:
        return super().counters() | self.engine.counters()

    def gauges(self) -> dict[str, float]:
        engine = self.engine.counters()
        return super().gauges() | {
            "num_waiting": float(engine["waiting_requests"] + self.coordinator.num_entries),
            "num_running": float(engine["running_requests"]),
        }


def derived_text_seed(base: int, text: str) -> int:
    """A request's seed when it gives none: a hash of the stage's engine seed and the text
    it draws, in [0, 2**63)."""
    digest = hashlib.sha256(f"{int(base)}|{text}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
