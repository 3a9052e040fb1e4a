"""`ARStageCore`: an autoregressive stage (thinker, talker) on our engine.

Requests start from a prompt (entry stage, or a `prompt` edge built by the
orchestrator) or from a payload of an incoming `payload` edge (e.g. another
stage's hidden states as prompt embeddings). Its `ARStageEngine` reports
every step result it accepted to `_on_core_output`, which feeds the request's
accumulator — so only confirmed tokens and hidden states ever reach a payload
(DESIGN.md invariant 6), in sync and async scheduling alike — and turns each
step into the `StageOutput` deltas this stage sends (text only where the stage
writes text).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from omnistage.config import EngineConfig
from omnistage.core.edge_processor import CONTEXT_CODES_KEY, IMAGE_GRID_KEY, PREFILL_KEY
from omnistage.core.engine_core_output import EngineCoreOutput
from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.core.payload import Payload
from omnistage.core.stage_input import StageInput
from omnistage.core.tensor_blob import blob_to_tensor
from omnistage.models import registry
from omnistage.models.parts import ROOT_CONFIG_ATTR
from omnistage.pipeline.accumulator import HIDDEN_KEY, RequestAccumulator
from omnistage.pipeline.ar_engine import ARStageEngine
from omnistage.pipeline.deploy import DeploySpec, StageSpec
from omnistage.pipeline.messages import (
    DeliverPayload,
    FromStage,
    RequestFailed,
    SubmitRequest,
)
from omnistage.pipeline.processors import stage_writes_text
from omnistage.pipeline.prompt_inputs import AUDIO_RATE
from omnistage.pipeline.stage_core import StageCore
from omnistage.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class ARStageCore(StageCore):
    def __init__(self, spec: StageSpec, deploy: DeploySpec, namespace: str) -> None:
        super().__init__(spec, deploy, namespace)
        if len(self.incoming) > 1:
            raise ValueError(f"stage {spec.name!r}: an ar stage takes at most one payload edge")
        wants_hidden = any(HIDDEN_KEY in p.accumulate for _, p in self.outgoing)
        engine_args = dict(spec.engine_args)
        if wants_hidden and engine_args.get("enable_prefix_caching", True):
            # A prefix-cache hit skips computing those positions, and so their hidden states.
            logger.info("stage %s: prefix caching off (its edges carry hidden states)", spec.name)
            engine_args["enable_prefix_caching"] = False
        self.engine = ARStageEngine(
            EngineConfig(
                model=spec.model,
                model_part=spec.model_part,
                **engine_args,
                output_hidden_states=wants_hidden,
            ),
            spec.name,
            writes_text=stage_writes_text(deploy, spec.name),
        )
        self.engine.core_output_listener = self._on_core_output
        for _, processor in self.incoming.values():
            processor.bind_consumer(self.engine)
        self.accumulators: dict[str, RequestAccumulator] = {}
        self.media_encoder: Any = None
        root_config = getattr(self.engine.hf_config, ROOT_CONFIG_ATTR, self.engine.hf_config)
        self.prompter_class = registry.stage_prompter_class(
            getattr(root_config, "model_type", None), spec.model_part
        )
        """A model that renders its own prompt from the request (GLM-Image's prior: for the
        request's `image_size`), or None."""
        self.prompter: Any = None
        self.failed: dict[str, str] = {}
        """Requests whose outputs could not be collected this step (failed, not the stage)."""

    def start(
        self,
        msg: SubmitRequest,
        payloads: dict[str, Payload] | None,
        stream_conditioning: bool = False,
        last: bool = True,
    ) -> list[FromStage]:
        """Start a request; streamed (`stream_conditioning`), from the first chunk, which is
        also the `last` one when the producer finished within it."""
        params = SamplingParams(**{**self.spec.default_sampling, **(msg.sampling or {})})
        if payloads:
            ((edge, payload),) = payloads.items()
            inputs = self.incoming[edge][1].to_input(payload, voice=msg.voice)
        elif self.prompter_class is not None:
            inputs, params = self._prompted_input(msg, params)
        elif msg.audios or msg.images:
            inputs = self._encode_media(msg)
        else:
            inputs = StageInput(prompt=msg.prompt, prompt_token_ids=msg.prompt_token_ids)
        if inputs.prompt_token_ids is not None:
            ids = list(inputs.prompt_token_ids)
        elif inputs.prompt is not None:
            _, ids = self.engine.inputs.tokenize(inputs.prompt)
        else:
            raise ValueError(f"stage {self.name!r}: the request has no prompt")
        conditioned = inputs.conditioning is not None
        self.engine.add_request(
            msg.request_id,
            ids,
            params,
            inputs.prompt_embeds,
            stream_conditioning or conditioned,
            inputs.mm_decoder_inputs,
        )
        finished = last or not stream_conditioning  # a whole payload: every row is known
        if conditioned or (finished and stream_conditioning):
            rows = inputs.conditioning
            self.engine.add_conditioning(
                msg.request_id,
                rows if rows is not None else torch.zeros(0, 0),
                finished,
                inputs.conditioning_fill if finished else None,
            )
        outgoing = self.outgoing_for(msg)
        if outgoing:
            self.accumulators[msg.request_id] = RequestAccumulator(
                msg.request_id, self.name, ids, outgoing, self.engine.config.torch_dtype
            )
            if inputs.image_grid_thw is not None and len(inputs.image_grid_thw):
                self.accumulators[msg.request_id].set_value(IMAGE_GRID_KEY, inputs.image_grid_thw)
                if inputs.prompt_embeds is not None:  # kept only where an edge collects it
                    self.accumulators[msg.request_id].set_value(PREFILL_KEY, inputs.prompt_embeds)
            if inputs.output_context is not None:
                self.accumulators[msg.request_id].set_value(
                    CONTEXT_CODES_KEY, inputs.output_context
                )
        return []

    def _encode_media(self, msg: SubmitRequest) -> StageInput:
        """A prompt with audio / images: the model's processor and encoders give its
        expanded token ids and input embeddings (encoders load on first use)."""
        if self.media_encoder is None:
            from omnistage.multimodal import load_input_encoder

            self.media_encoder = load_input_encoder(
                self.engine.model_files.path, self.engine.config.torch_dtype
            )
        prompt = msg.prompt_token_ids if msg.prompt_token_ids is not None else msg.prompt
        if prompt is None:
            raise ValueError(f"stage {self.name!r}: the request has no prompt")
        encoded = self.media_encoder.encode(
            prompt,
            [(blob_to_tensor(a).numpy(), AUDIO_RATE) for a in msg.audios],
            [blob_to_tensor(i).numpy() for i in msg.images],
        )
        return StageInput(
            prompt=msg.prompt,
            prompt_token_ids=encoded.prompt_token_ids,
            prompt_embeds=encoded.prompt_embeds,
            mm_decoder_inputs=MultimodalDecoderInputs.from_encoded_prompt(encoded),
            image_grid_thw=encoded.image_grid_thw,
        )

    def _prompted_input(
        self, msg: SubmitRequest, params: SamplingParams
    ) -> tuple[StageInput, SamplingParams]:
        """The input of a model that renders its own prompt, and the token budget it sets,
        if any (the prompter loads on first use)."""
        if self.prompter is None:
            self.prompter = self.prompter_class.from_checkpoint(
                self.engine.model_files.path, dtype=self.engine.config.torch_dtype
            )
        inputs, budget = self.prompter.request_input(self.name, msg)
        if getattr(self.prompter, "reads_model_options", False):  # the engine refuses others
            params = dataclasses.replace(params, model_options=None)
        if budget is None:
            return inputs, params
        stops = [*(params.stop_token_ids or ()), *budget.stop_token_ids]
        return inputs, dataclasses.replace(
            params,
            max_tokens=budget.max_tokens,
            min_tokens=min(max(params.min_tokens, budget.min_tokens), budget.max_tokens),
            stop_token_ids=stops or None,
        )

    def on_input(self, msg: DeliverPayload, payload: Payload) -> list[FromStage]:
        entry = self.coordinator.arrived(msg.request_id, msg.edge, payload, msg.last)
        if entry is None:
            return []
        edge, processor = self.incoming[msg.edge]
        if edge.transfer == "stream":
            return self._on_chunk(msg, entry.submit, processor, payload)
        if entry.waiting_edges:
            return []
        self.coordinator.release(msg.request_id)
        return self.start(entry.submit, entry.received)

    def _on_chunk(
        self, msg: DeliverPayload, submit: SubmitRequest, processor: Any, payload: Payload
    ) -> list[FromStage]:
        """Stream in: the first chunk starts the request (its prompt); each later chunk's rows
        condition one position each of what the request generates."""
        rid = msg.request_id
        events: list[FromStage] = []
        if msg.chunk_index == 0:
            events = self.start(submit, {msg.edge: payload}, True, msg.last)
        else:
            rows, fill = processor.to_conditioning(payload, msg.last)
            self.engine.add_conditioning(rid, rows, msg.last, fill)
        if msg.last:
            self.coordinator.release(rid)
        return events

    def _on_core_output(self, request_id: str, out: EngineCoreOutput) -> None:
        accumulator = self.accumulators.get(request_id)
        if accumulator is not None and request_id not in self.failed:
            try:
                accumulator.add_step(
                    out.new_token_ids, out.hidden_states, out.hidden_start, out.new_codes
                )
            except Exception as exc:  # one request's payload is broken: fail it alone
                logger.exception("stage %s: request %s", self.name, request_id)
                self.failed[request_id] = f"{type(exc).__name__}: {exc}"

    def step(self) -> list[FromStage]:
        events: list[FromStage] = []
        outputs = self.engine.step()
        self.stalled = not self.engine.core.made_progress  # e.g. all wait for conditioning
        for output in outputs:
            rid = output.request_id
            if rid in self.failed:
                continue
            accumulator = self.accumulators.get(rid)
            if accumulator is not None:
                pieces = (
                    accumulator.final_payloads() if output.finished else accumulator.ready_chunks()
                )
                events += self.send_payloads(rid, pieces)
            events.append(output)
            if output.finished:
                self.accumulators.pop(rid, None)
                # Done before its input stream ended: the rest of the stream is not needed
                # (chunks that still come are dropped on arrival).
                self.coordinator.release(rid)
        for rid, message in self.failed.items():
            self.abort(rid)
            events.append(RequestFailed(stage=self.name, request_id=rid, message=message))
        self.failed.clear()
        return events

    def drop_request(self, request_id: str) -> None:
        self.engine.abort_request(request_id)
        self.accumulators.pop(request_id, None)

    def step_request_ids(self) -> list[str]:
        return self.engine.request_ids()  # a step's batch is not known before it is scheduled

    def has_work(self) -> bool:
        return self.engine.has_unfinished_requests()

    def counters(self) -> dict[str, Any]:
        kv = self.engine.kv_cache_manager
        return super().counters() | {
            "engine_requests": self.engine.num_unfinished_requests,
            "kv_blocks_used": kv.pool.num_usable_blocks - kv.num_free_blocks,
            "accumulator_entries": len(self.accumulators),
            "conditioning_fills_unsent": self.engine.core.scheduler.conditioning.num_unsent_fills,
        }

    def gauges(self) -> dict[str, float]:
        scheduler = self.engine.core.scheduler
        kv = self.engine.kv_cache_manager
        total = kv.pool.num_usable_blocks
        # Waiting for input and not started yet (a stream-fed request runs meanwhile).
        parked = [r for r in self.coordinator.entries if not self.engine.has_request(r)]
        return {
            "num_waiting": float(len(scheduler.waiting) + len(parked)),
            "num_running": float(len(scheduler.running)),
            "kv_cache_usage": (total - kv.num_free_blocks) / total if total else 0.0,
        }

    def speculation(self) -> dict[str, Any] | None:
        stats = self.engine.core.scheduler.spec_stats
        return dataclasses.asdict(stats) if stats.num_speculative_tokens else None

    def shutdown(self) -> None:
        self.engine.shutdown()
        super().shutdown()
