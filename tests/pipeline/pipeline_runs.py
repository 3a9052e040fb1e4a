"""Run the tiny pipeline in-process and keep what a sync/async comparison needs.

`run_pipeline` returns, per prompt, the final outputs (thinker tokens and finish
reason, audio bytes), every payload exactly as its consumer stage *received* it
(keyed by prompt index, edge and chunk; the random request id left out), and a
`SchedulingProbe` per autoregressive stage, which says whether the stage really
scheduled ahead and whether a step's results arrived for requests that had ended.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from omnistage.core.payload import Payload, pack_payload, unpack_payload
from omnistage.pipeline.omni import Omni
from tests.scheduling_probe import SchedulingProbe

AR_STAGES = ("thinker", "talker")


@dataclass
class PipelineRun:
    outputs: list[tuple[list[int], str | None, bytes]]
    """Per prompt: the thinker's tokens and finish reason, the audio's bytes."""
    received: dict[tuple[int, str, int], Payload]
    """(prompt index, edge, chunk index) -> the payload its consumer got."""
    received_bytes: dict[tuple[int, str, int], bytes]
    """The same payloads packed (byte-exact comparison)."""
    probes: dict[str, SchedulingProbe]
    cores: dict[str, Any]
    """Stage name -> its engine core (for its scheduler's and step's kind)."""
    counters: dict[str, dict[str, int]]


def run_pipeline(deploy: dict[str, Any], prompts: list[str], params: Any = None) -> PipelineRun:
    """Generate `prompts` (every request must succeed) and collect a `PipelineRun`."""
    got: dict[str, bytes] = {}
    with Omni(deploy, in_process=True) as omni:
        clients = omni.orchestrator.clients
        for client in clients.values():
            for connector in client.core.connectors.values():
                _record_gets(connector, got)
        cores = {name: clients[name].core.engine.core for name in AR_STAGES}
        probes = {name: SchedulingProbe(core) for name, core in cores.items()}
        with ExitStack() as stack:
            for probe in probes.values():
                stack.enter_context(probe)
            outputs = omni.generate(prompts, params)
        counters = omni.stage_counters()
    assert [o.error for o in outputs] == [None] * len(prompts)
    received_bytes = _by_prompt(got, outputs)
    return PipelineRun(
        outputs=[
            (o.token_ids, o.outputs["thinker"].finish_reason, o.audio.tobytes()) for o in outputs
        ],
        received={k: unpack_payload(data) for k, data in received_bytes.items()},
        received_bytes=received_bytes,
        probes=probes,
        cores=cores,
        counters=counters,
    )


def run_recorded(spec: Any, prompts: list[Any], params: Any = None) -> tuple[list, dict]:
    """Generate `prompts` in process: (the outputs, every payload a consumer stage got,
    packed, keyed (prompt index, edge, chunk index)). Every request must succeed and every
    stage's counters (requests, KV, buffers) be back at zero."""
    got: dict[str, bytes] = {}
    with Omni(spec, in_process=True) as omni:
        for client in omni.orchestrator.clients.values():
            for connector in client.core.connectors.values():
                _record_gets(connector, got)
        outputs = omni.generate(prompts, params)
        counters = omni.stage_counters()
    assert [o.error for o in outputs] == [None] * len(prompts)
    assert all(v == 0 for c in counters.values() for v in c.values()), counters
    return outputs, _by_prompt(got, outputs)


def _by_prompt(got: dict[str, bytes], outputs: list[Any]) -> dict[tuple[int, str, int], bytes]:
    """`got` keyed by (prompt index, edge, chunk index) instead of the request's key."""
    index = {o.request_id: i for i, o in enumerate(outputs)}
    received: dict[tuple[int, str, int], bytes] = {}
    for key, data in got.items():
        rid, edge, chunk = key.rsplit("/", 2)
        received[index[rid], edge, int(chunk)] = data
    return received


def _record_gets(connector: Any, got: dict[str, bytes]) -> None:
    """Keep every payload `connector` hands its stage, packed at once (byte-exact, and safe
    from whatever the stage does with the tensors later), but for the request id."""
    get = connector.get

    def recording_get(handle: Any, timeout: float | None = None) -> Payload:
        payload = get(handle, timeout)
        got[handle.key] = pack_payload({k: v for k, v in payload.items() if k != "meta.request_id"})
        return payload

    connector.get = recording_get
