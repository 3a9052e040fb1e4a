"""`GenerationStageCore`: a stage that turns whole inputs (or stream chunks) into outputs.

Each arriving payload or chunk becomes a work item (`GenerationItem`): its
input rows with up to `left_context` rows of the request's earlier chunks in
front. With `right_context` R on the edge (a model that looks ahead, e.g.
Qwen2.5-Omni's token2wav), the last R rows of each arriving chunk are held
back: the item decodes them as context behind its own rows (rows
`[start - left, end + R)` of the request, output of `[start, end)` only), and
they become own rows of the next chunk's item; the last chunk flushes them. A
chunk with no more than R rows (with those held back before) makes no item.
Every step runs up to `max_num_seqs` items, oldest first, through the model in
one call (continuous batching: items of different requests share a step), and
emits each item's output in chunk order; the item of the last chunk finishes
the request. The model checks each item as it arrives (`check_item`): a bad one
(e.g. a code outside the vocoder's codebook) fails its request alone, naming
the stage, instead of the step that would run it with others. A batch whose
model call raises anyway is run again item by item, so the error fails only the
requests whose items raise alone.

Models that sample noise (`takes_seeds_and_speakers`, e.g. Qwen2.5-Omni's
token2wav) get one seed per request, the same for all its chunks: the `seed`
of the request's sampling parameters for this stage (`{"token2wav":
SamplingParams(seed=...)}`, else the stage's `default_sampling`), or, when
neither gives one, a seed derived from the stage's engine seed and the
request's first input rows (its codes; for a stream, its first chunk's): the
same codes give the same output in any batch, order or run, so a request whose
producer is seeded (or greedy) is reproducible end to end. Their speaker is the
request's voice (`SubmitRequest.voice`, validated by the frontend), else the
model's default.

A generation stage may also be a pipeline's entry (a model that `takes_prompts`: its
input rows come from the request's prompt) and may feed further stages: when a request's
item finishes, each outgoing edge it feeds gets one whole payload made by the edge's
processor from the item's metadata and the model's output (`from_generation`), with
`meta.finished`; a consumer stage gets the metadata back (`to_meta`) with its input rows,
so flattened prompt fields (speaker, language, …) travel hop by hop (Dynin-Omni's
token2text -> token2image -> token2audio).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from omnistage.config import EngineConfig
from omnistage.core.edge_processor import CONTEXT_CODES_KEY, EdgeProcessor
from omnistage.core.payload import Payload
from omnistage.core.tensor_blob import blob_to_tensor, tensor_to_blob
from omnistage.models.generation import GenerationItem, load_generation_model
from omnistage.models.loader import resolve_model
from omnistage.pipeline.deploy import DeploySpec, EdgeSpec, StageSpec
from omnistage.pipeline.messages import DeliverPayload, FromStage, StageOutput, SubmitRequest
from omnistage.pipeline.stage_core import StageCore
from omnistage.platforms import platform_for

logger = logging.getLogger(__name__)


@dataclass
class _WorkItem:
    request_id: str
    chunk_index: int
    item: GenerationItem
    last: bool
    feeds: list[tuple[EdgeSpec, EdgeProcessor]] = field(default_factory=list)
    """The outgoing edges the request feeds (each gets a payload when the item is last)."""


@dataclass
class _Stream:
    """A request whose last chunk has not arrived yet."""

    seed: int | None
    """For models that take seeds (see the module docstring)."""
    context: torch.Tensor
    """The last `left_context` rows already decoded as own rows."""
    held: torch.Tensor
    """Rows held back (right context of the last item), own rows of the next one."""
    position: int = 0
    """Index of `held[0]` in the request's whole input."""
    speaker: str | None = None
    """For models that take speakers: the request's voice (None: the model's default)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """The metadata the request's first payload carried (`EdgeProcessor.to_meta`)."""
    state: dict[str, Any] = field(default_factory=dict)
    """What the model keeps between the request's chunks (`GenerationItem.state`)."""


class GenerationStageCore(StageCore):
    def __init__(self, spec: StageSpec, deploy: DeploySpec, namespace: str) -> None:
        super().__init__(spec, deploy, namespace)
        if len(self.incoming) > 1:
            raise ValueError(
                f"stage {spec.name!r}: a generation stage takes at most one payload or stream "
                f"edge in, got {len(self.incoming)}"
            )
        self.edge_name, self.edge, self.processor = None, None, None
        for name, (edge, processor) in self.incoming.items():
            self.edge_name, self.edge, self.processor = name, edge, processor
            if processor.input_key is None:
                raise ValueError(
                    f"stage {spec.name!r}: edge processor {processor.name!r} gives no input "
                    "for a generation stage"
                )
        for edge, _ in self.outgoing:
            if edge.transfer != "payload":
                raise ValueError(
                    f"stage {spec.name!r}: a generation stage sends whole payloads "
                    f"(transfer: payload), not {edge.transfer!r}"
                )
        config = EngineConfig(model=spec.model, **spec.engine_args)
        platform = platform_for(config.device)
        platform.configure_threads(config.num_threads)
        self.model = load_generation_model(
            resolve_model(config.model).path, config.torch_dtype, spec.model_part
        )
        if self.processor is None and not self.model.takes_prompts:
            raise ValueError(
                f"stage {spec.name!r}: a generation stage needs exactly one payload or stream "
                "edge in, got 0"
            )
        self.max_batch = config.max_num_seqs
        self.engine_seed = config.seed
        self.queue: deque[_WorkItem] = deque()
        self.streams: dict[str, _Stream] = {}
        """Per request with chunks still to come: its seed, context and held rows."""

    def start(self, msg: SubmitRequest, payloads: dict[str, Payload] | None) -> list[FromStage]:
        if self.processor is not None:
            raise ValueError(
                f"stage {self.name!r} (generation) starts only from its input edge "
                f"{self.edge_name!r}"
            )
        rows = self.model.prompt_rows(msg.prompt, msg.prompt_token_ids)
        item = GenerationItem(rows, seed=self._seed(msg, rows), meta=request_meta(msg))
        if msg.images:
            self.model.take_images(item, [blob_to_tensor(i).numpy() for i in msg.images])
        if msg.audios:
            self.model.take_audios(item, [blob_to_tensor(a).numpy() for a in msg.audios])
        self.model.check_item(item)  # a ValueError fails this request (`handle`)
        self.queue.append(_WorkItem(msg.request_id, 0, item, True, self.outgoing_for(msg)))
        return []

    def on_input(self, msg: DeliverPayload, payload: Payload) -> list[FromStage]:
        rid = msg.request_id
        entry = self.coordinator.arrived(rid, msg.edge, None, msg.last)
        if entry is None:
            return []
        rows = payload[self.processor.input_key]
        stream = self.streams.get(rid)
        if stream is None:
            seed = self._seed(entry.submit, rows)
            speaker = entry.submit.voice if self.model.takes_seeds_and_speakers else None
            stream = _Stream(seed, self._prefix(payload, rows), rows[:0], speaker=speaker)
            stream.meta = self.processor.to_meta(payload)
        rows = torch.cat([stream.held, rows])
        held = 0 if msg.last else min(self.edge.right_context, rows.shape[0])
        own = rows.shape[0] - held
        if own > 0 or msg.last:
            before = stream.context
            item = GenerationItem(
                torch.cat([before, rows]),
                context_len=before.shape[0],
                lookahead_len=held,
                offset=stream.position - before.shape[0],
                seed=stream.seed,
                speaker=stream.speaker,
                last=msg.last,
                meta=dict(stream.meta),
                state=stream.state,
            )
            self.model.check_item(item)  # a ValueError fails this request (`handle`)
            feeds = self.outgoing_for(entry.submit)
            self.queue.append(_WorkItem(rid, msg.chunk_index, item, msg.last, feeds))
        if msg.last:
            self.coordinator.release(rid)
            self.streams.pop(rid, None)
            return []
        if self.edge.left_context and own:
            stream.context = torch.cat([stream.context, rows[:own]])[-self.edge.left_context :]
        stream.held, stream.position = rows[own:], stream.position + own
        self.streams[rid] = stream
        return []

    def _seed(self, submit: SubmitRequest, rows: torch.Tensor) -> int | None:
        """A request's seed for a model that takes seeds (see the module docstring)."""
        if not self.model.takes_seeds_and_speakers:
            return None
        seed = {**self.spec.default_sampling, **(submit.sampling or {})}.get("seed")
        return derived_seed(self.engine_seed, rows) if seed is None else seed

    def _prefix(self, payload: Payload, rows: torch.Tensor) -> torch.Tensor:
        """The left context of a request's first rows: the frames its producer sent as
        context only (`CONTEXT_CODES_KEY`), the last `left_context` of them when the edge
        streams with a left context; none by default."""
        prefix = payload.get(CONTEXT_CODES_KEY)
        if prefix is None:
            return rows[:0]
        prefix = prefix.to(rows.dtype)
        if self.edge.transfer == "stream" and self.edge.left_context:
            prefix = prefix[-self.edge.left_context :]
        return prefix

    def step(self) -> list[FromStage]:
        items = [self.queue.popleft() for _ in range(min(self.max_batch, len(self.queue)))]
        if not items:
            return []
        try:
            outputs = self.model.generate([i.item for i in items])
        except Exception:
            if len(items) == 1:
                raise  # `run_step` fails its request
            logger.exception("stage %s: a batch of %d items failed", self.name, len(items))
            return self._step_one_by_one(items)
        events: list[FromStage] = []
        for item, out in zip(items, outputs, strict=True):
            events += self._output(item, out)
        return events

    def _step_one_by_one(self, items: list[_WorkItem]) -> list[FromStage]:
        """After a batch failed: each item alone, so the error falls on its own request; the
        others get what the batch would have given them (items do not interact)."""
        events: list[FromStage] = []
        failed: set[str] = set()
        for item in items:
            if item.request_id in failed:
                continue
            try:
                (out,) = self.model.generate([item.item])
            except Exception as exc:
                failed.add(item.request_id)
                error = f"the step running this request failed: {type(exc).__name__}: {exc}"
                events += self._fail([item.request_id], error)
                continue
            events += self._output(item, out)
        return events

    def _output(self, item: _WorkItem, out: torch.Tensor) -> list[FromStage]:
        """The item's output for the orchestrator and, when it is the request's last, one
        whole payload on each edge the request feeds (sent first: the orchestrator parks
        the consumer before the request can end here)."""
        events: list[FromStage] = []
        if item.last and item.feeds:
            pieces = [
                (edge, 0, processor.from_generation(item.item.meta, out), True)
                for edge, processor in item.feeds
            ]
            events += self.send_payloads(item.request_id, pieces)
        text = self.model.output_text(item.item, out) if item.last else ""
        events.append(
            StageOutput(
                stage=self.name,
                request_id=item.request_id,
                new_text=text,
                new_token_ids=out.tolist() if text else [],
                data=tensor_to_blob(out),
                finished=item.last,
                finish_reason="stop" if item.last else None,
            )
        )
        return events

    def step_request_ids(self) -> list[str]:
        batch = itertools.islice(self.queue, self.max_batch)
        return list(dict.fromkeys(item.request_id for item in batch))

    def drop_request(self, request_id: str) -> None:
        self.streams.pop(request_id, None)
        if any(i.request_id == request_id for i in self.queue):
            self.queue = deque(i for i in self.queue if i.request_id != request_id)

    def has_work(self) -> bool:
        return bool(self.queue)

    def counters(self) -> dict[str, Any]:
        return super().counters() | {
            "queued_items": len(self.queue),
            "stream_entries": len(self.streams),
        }

    def gauges(self) -> dict[str, float]:
        running = {item.request_id for item in self.queue}
        waiting = set(self.coordinator.entries) - running
        return super().gauges() | {
            "num_waiting": float(len(waiting)),
            "num_running": float(len(running)),
        }


def derived_seed(base: int, rows: torch.Tensor) -> int:
    """A request's seed when it gives none: a hash of the stage's engine seed and the
    request's (first) input rows, in [0, 2**63)."""
    rows = rows.detach().cpu().contiguous()
    if not rows.is_floating_point():
        rows = rows.long()  # codes hash alike whatever int dtype carried them
    digest = hashlib.sha256(f"{int(base)}|{rows.dtype}|{list(rows.shape)}|".encode())
    digest.update(rows.numpy().tobytes())
    return int.from_bytes(digest.digest()[:8], "little") >> 1


def request_meta(msg: SubmitRequest) -> dict[str, Any]:
    """The metadata an entry generation stage starts a request's item with: the request's
    speaker (`voice`), language and wanted output types, where given."""
    meta: dict[str, Any] = {}
    if msg.voice is not None:
        meta["speaker"] = msg.voice
    if msg.language is not None:
        meta["language"] = msg.language
    if msg.modalities:
        meta["modalities"] = ",".join(msg.modalities)
    return meta
