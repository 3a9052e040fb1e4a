"""`GenerationStageCore`: a stage that turns whole inputs (or stream chunks) into outputs.

Each arriving payload or chunk becomes a work item: its input rows with up to
`left_context` rows of the request's earlier chunks in front. Every step runs
up to `max_num_seqs` items, oldest first, through the model in one call
(continuous batching: items of different requests share a step), and emits
each item's output in chunk order; the item of the last chunk finishes the
request.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from omnistage.config import EngineConfig
from omnistage.core.tensor_blob import tensor_to_blob
from omnistage.models.generation import load_generation_model
from omnistage.models.loader import resolve_model
from omnistage.pipeline.deploy import DeploySpec, StageSpec
from omnistage.pipeline.messages import DeliverPayload, FromStage, StageOutput, SubmitRequest
from omnistage.pipeline.payload import Payload
from omnistage.pipeline.stage_core import StageCore
from omnistage.platforms import platform_for


@dataclass
class _WorkItem:
    request_id: str
    chunk_index: int
    inputs: torch.Tensor
    context_len: int
    last: bool


class GenerationStageCore(StageCore):
    def __init__(self, spec: StageSpec, deploy: DeploySpec, namespace: str) -> None:
        super().__init__(spec, deploy, namespace)
        if len(self.incoming) != 1:
            raise ValueError(
                f"stage {spec.name!r}: a generation stage needs exactly one payload or stream "
                f"edge in, got {len(self.incoming)}"
            )
        ((self.edge_name, (self.edge, self.processor)),) = self.incoming.items()
        if self.processor.input_key is None:
            raise ValueError(
                f"stage {spec.name!r}: edge processor {self.processor.name!r} gives no input "
                "for a generation stage"
            )
        config = EngineConfig(model=spec.model, **spec.engine_args)
        platform = platform_for(config.device)
        platform.configure_threads(config.num_threads)
        self.model = load_generation_model(
            resolve_model(config.model).path, config.torch_dtype, spec.model_part
        )
        self.max_batch = config.max_num_seqs
        self.queue: deque[_WorkItem] = deque()
        self.context: dict[str, torch.Tensor] = {}
        """Per request: the last `left_context` input rows of its earlier chunks."""

    def start(self, msg: SubmitRequest, payloads: dict[str, Payload] | None) -> list[FromStage]:
        raise ValueError(
            f"stage {self.name!r} (generation) starts only from its input edge {self.edge_name!r}"
        )

    def on_input(self, msg: DeliverPayload, payload: Payload) -> list[FromStage]:
        rid = msg.request_id
        if self.coordinator.arrived(rid, msg.edge, None, msg.last) is None:
            return []
        rows = payload[self.processor.input_key]
        before = self.context.get(rid, rows[:0])
        self.queue.append(
            _WorkItem(rid, msg.chunk_index, torch.cat([before, rows]), len(before), msg.last)
        )
        if msg.last:
            self.coordinator.release(rid)
            self.context.pop(rid, None)
        elif self.edge.left_context:
            self.context[rid] = torch.cat([before, rows])[-self.edge.left_context :]
        return []

    def step(self) -> list[FromStage]:
        items = [self.queue.popleft() for _ in range(min(self.max_batch, len(self.queue)))]
        if not items:
            return []
        outputs = self.model.generate([i.inputs for i in items], [i.context_len for i in items])
        return [
            StageOutput(
                stage=self.name,
                request_id=item.request_id,
                data=tensor_to_blob(out),
                finished=item.last,
                finish_reason="stop" if item.last else None,
            )
            for item, out in zip(items, outputs, strict=True)
        ]

    def drop_request(self, request_id: str) -> None:
        self.context.pop(request_id, None)
        if any(i.request_id == request_id for i in self.queue):
            self.queue = deque(i for i in self.queue if i.request_id != request_id)

    def has_work(self) -> bool:
        return bool(self.queue)

    def counters(self) -> dict[str, Any]:
        return super().counters() | {
            "queued_items": len(self.queue),
            "context_entries": len(self.context),
        }
