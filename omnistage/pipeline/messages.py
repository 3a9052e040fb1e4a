"""Control-plane messages between the orchestrator and stage processes (msgspec, tagged).

Only small things travel here: requests, deltas of text and tokens, payload
*handles* and errors. Bulk data (hidden states, codes, waveforms in flight
between stages) goes through connectors; a stage's final output (e.g. a
waveform chunk for the caller) travels as a `TensorBlob`.
"""

from __future__ import annotations

from typing import Any

import msgspec
import zmq

from omnistage.core.tensor_blob import TensorBlob
from omnistage.pipeline.connectors.base import PayloadHandle


class _Msg(msgspec.Struct, tag=True, kw_only=True):
    pass


# -- orchestrator -> stage ---------------------------------------------------------------------
class SubmitRequest(_Msg):
    """Start `request_id` on the stage. With `wait_for` the request parks in
    WAITING_FOR_INPUT until a payload of each listed edge has arrived."""

    request_id: str
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    sampling: dict[str, Any] | None = None
    """SamplingParams fields for AR stages (validated by the frontend before submission)."""
    wait_for: list[str] = msgspec.field(default_factory=list)
    """Incoming edges ("producer->consumer") whose payload this request needs."""
    send_to: list[str] | None = None
    """Outgoing payload/stream edges this request feeds (None: all). A text-only request
    on a thinker does not collect hidden states for a talker it will never reach."""
    audios: list[TensorBlob] = msgspec.field(default_factory=list)
    """Entry stage: the prompt's audio clips, decoded by the frontend (float32 mono at the
    rate the model's feature extractor takes), in placeholder order."""
    images: list[TensorBlob] = msgspec.field(default_factory=list)
    """Entry stage: the prompt's images, decoded by the frontend ([H, W, 3] uint8)."""
    image_size: list[int] | None = None
    """`[height, width]` of the image the pipeline will draw (resolved by the frontend from
    its diffusion stage's parameters), for stages whose prompt depends on it (GLM-Image's
    prior states the size in its prompt); None when the pipeline draws nothing."""
    voice: str | None = None
    """The speaker the pipeline's talker speaks with (validated by the frontend against the
    checkpoint's speakers, sent to every stage of the request; processors that build a
    talker's input and speaker-conditioned vocoders use it); None: the model's default."""
    instructions: str | None = None
    """How to speak (a TTS talker that takes instructions: style, emotion, or the voice
    itself described in words); None: none."""
    language: str | None = None
    """The language to speak (a TTS talker's; None: detected, "auto")."""
    modalities: list[str] | None = None
    """The output types the request wants (its final stages'), for an entry model that picks
    its task by them (Dynin-Omni's token2text); None: not said."""


class DeliverPayload(_Msg):
    """A payload (or a stream chunk) for `request_id` is ready in a connector."""

    request_id: str
    edge: str
    handle: PayloadHandle
    chunk_index: int
    last: bool


class AbortRequest(_Msg):
    request_id: str


class GetStats(_Msg):
    pass


class Shutdown(_Msg):
    pass


class Ping(_Msg):
    """Are you there? A stage answers `Pong` between two steps (the orchestrator's liveness
    check of a silent stage: a stage that says nothing for `hang_timeout_s` is hung; while a
    step runs, the stage's heartbeat thread says `Busy` instead)."""


ToStage = SubmitRequest | DeliverPayload | AbortRequest | GetStats | Shutdown | Ping


# -- stage -> orchestrator ---------------------------------------------------------------------
class StageReady(_Msg):
    stage: str
    pid: int
    sample_rate: int | None = None
    """For stages whose output is audio."""


class StageFatal(_Msg):
    """The stage could not start (or hit an unrecoverable error); it is exiting."""

    stage: str
    message: str
    pid: int = 0
    """The reporting process (an earlier, dead one's late report is not the current one's)."""


class Pong(_Msg):
    """The answer to `Ping`."""

    stage: str


class Busy(_Msg):
    """The stage's loop is inside one step (or one batch of messages), and has been for
    `busy_s` seconds: sent by the stage's heartbeat thread while a step runs, so a long
    step is not taken for a hang (`pipeline/step_heartbeat.py`)."""

    stage: str
    busy_s: float
    pid: int = 0
    """The reporting process (a reaped one's late word is not the current one's)."""


class StageOutput(_Msg):
    """What a request produced on a stage this step: only what is new (the orchestrator
    appends it to the request's result)."""

    stage: str
    request_id: str
    new_token_ids: list[int] = msgspec.field(default_factory=list)
    new_text: str = ""
    """Text new this step (AR stages that write text; a stop string's possible start is
    held back until it is known not to be one, so text sent is never taken back)."""
    data: TensorBlob | None = None
    """A piece of a generation stage's output (e.g. a waveform chunk), in order."""
    finished: bool = False
    finish_reason: str | None = None
    progress: list[int] | None = None
    """Diffusion stages: `[steps done, steps in all]` after a denoising step."""
    num_prompt_tokens: int | None = None
    """An ar stage's first output of a request: the positions its prompt took in the model,
    media placeholders expanded (what `usage.prompt_tokens` counts)."""


class PayloadReady(_Msg):
    """The producer put a payload for an edge; the orchestrator forwards the handle."""

    stage: str
    request_id: str
    edge: str
    handle: PayloadHandle
    chunk_index: int
    last: bool


class RequestFailed(_Msg):
    stage: str
    request_id: str
    message: str


class StageStats(_Msg):
    stage: str
    counters: dict[str, int]
    """Resources held (all zero when nothing runs: the leak checks read them)."""
    gauges: dict[str, float] = msgspec.field(default_factory=dict)
    """Scheduler state for metrics (`StageCore.gauges`): `num_waiting`, `num_running`,
    `kv_cache_usage` (0..1)."""
    speculation: dict[str, Any] | None = None
    """A speculating stage's totals (`SpecDecodeStats` fields), else None."""


FromStage = (
    StageReady | StageFatal | StageOutput | PayloadReady | RequestFailed | StageStats | Pong | Busy
)

to_stage_encoder = msgspec.msgpack.Encoder()
to_stage_decoder = msgspec.msgpack.Decoder(ToStage)
from_stage_encoder = to_stage_encoder
from_stage_decoder = msgspec.msgpack.Decoder(list[FromStage])
"""A stage reports a step's events as one message (a list): one send per step, not per event."""


def drain_reports(socket: zmq.Socket) -> list[FromStage]:
    """Every report already queued on `socket` (never waits): each frame is one step's list."""
    events: list[FromStage] = []
    while True:
        try:
            frame = socket.recv(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return events
        events += from_stage_decoder.decode(frame.buffer)
