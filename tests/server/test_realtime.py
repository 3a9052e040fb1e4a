"""WebSocket /v1/realtime on demo-omni (thinker -> talker -> code2wav), with the real server
on a loopback port and a real WebSocket client (`websockets`): text in -> the same audio
and transcript as /v1/chat/completions, audio in through the input buffer, interruption,
bad events, and a client that goes away mid-response."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile
from websockets.sync.client import ClientConnection, connect

from tests.server.conftest import PipelineServer, record_aborts

MODEL = "demo-omni"
HELLO = "Say hello."


@contextlib.contextmanager
def realtime(server: PipelineServer, model: str = MODEL) -> Iterator[ClientConnection]:
    """A connected realtime session (its `session.created` read)."""
    url = f"ws://127.0.0.1:{server.port}/v1/realtime?model={model}"
    with connect(url, max_size=None, open_timeout=30) as ws:
        created = recv(ws)
        assert created["type"] == "session.created", created
        yield ws


def send(ws: ClientConnection, kind: str, **fields: Any) -> None:
    ws.send(json.dumps({"type": kind, **fields}))


def recv(ws: ClientConnection, timeout: float = 120) -> dict[str, Any]:
    return json.loads(ws.recv(timeout))


def until(ws: ClientConnection, kind: str, timeout: float = 120) -> list[dict[str, Any]]:
    """Every event up to and including the first of type `kind`."""
    events = [recv(ws, timeout)]
    while events[-1]["type"] != kind:
        events.append(recv(ws, timeout))
    return events


def user_text(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def test_text_in_gives_the_chat_route_s_audio_and_transcript(speech_server: PipelineServer):
    client = speech_server.openai()
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": HELLO}],
        modalities=["text", "audio"],
        audio={"format": "pcm16", "voice": "ethan"},
        max_tokens=6,
        temperature=0,
        seed=7,
    )
    message = chat.choices[0].message
    with realtime(speech_server) as ws:
        settings = {"voice": "Ethan", "temperature": 0, "max_response_output_tokens": 6, "seed": 7}
        send(ws, "session.update", session=settings)
        updated = recv(ws)["session"]
        assert (updated["voice"], updated["max_response_output_tokens"]) == ("ethan", 6)
        send(ws, "conversation.item.create", item=user_text(HELLO))
        assert recv(ws)["type"] == "conversation.item.created"
        send(ws, "response.create")
        events = until(ws, "response.done")

        audio = b"".join(base64.b64decode(e["delta"]) for e in of(events, "response.audio.delta"))
        assert len(of(events, "response.audio.delta")) >= 1
        assert audio == base64.b64decode(message.audio.data)  # the same pcm16, byte for byte
        transcript = "".join(e["delta"] for e in of(events, "response.audio_transcript.delta"))
        assert transcript == message.content and transcript
        assert of(events, "response.audio_transcript.done")[0]["transcript"] == transcript
        kinds = [e["type"] for e in events if not e["type"].endswith(".delta")]
        assert kinds == [
            "response.created",
            "response.output_item.added",
            "conversation.item.created",
            "response.content_part.added",
            "response.audio.done",
            "response.audio_transcript.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.done",
        ]
        done = events[-1]["response"]
        assert done["voice"] == "ethan" and done["max_output_tokens"] == 6
        finish = chat.choices[0].finish_reason
        assert done["status"] == ("incomplete" if finish == "length" else "completed")
        assert done["output"][0]["content"] == [{"type": "audio", "transcript": transcript}]
        assert done["usage"]["output_tokens"] == chat.usage.completion_tokens
        assert done["usage"]["input_tokens"] == chat.usage.prompt_tokens

        # The next response's prompt holds the earlier turns, as a chat client sends them.
        send(ws, "conversation.item.create", item=user_text("Once more."))
        recv(ws)
        send(ws, "response.create", response={"modalities": ["text"]})
        events = until(ws, "response.done")
        text = "".join(e["delta"] for e in of(events, "response.text.delta"))
    history = [
        {"role": "user", "content": HELLO},
        {"role": "assistant", "content": transcript},
        {"role": "user", "content": "Once more."},
    ]
    again = client.chat.completions.create(
        model=MODEL, messages=history, modalities=["text"], max_tokens=6, temperature=0
    )
    assert text == again.choices[0].message.content
    speech_server.wait_idle()


def _sine_pcm16(seconds: float = 0.5, rate: int = 24000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2").tobytes()


def test_audio_in_through_the_input_buffer(speech_server: PipelineServer):
    pcm = _sine_pcm16()
    wav = io.BytesIO()
    soundfile.write(wav, np.frombuffer(pcm, "<i2"), 24000, format="WAV", subtype="PCM_16")
    part = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(wav.getvalue()).decode(), "format": "wav"},
    }
    chat = speech_server.openai().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": [part]}],
        modalities=["text"],
        max_tokens=4,
        temperature=0,  # type: ignore[list-item]
    )
    with realtime(speech_server) as ws:
        send(
            ws, "session.update", session={"modalities": ["text"], "max_response_output_tokens": 4}
        )
        assert recv(ws)["session"]["modalities"] == ["text"]
        third = len(pcm) // 3 & ~1
        for chunk in (pcm[:third], pcm[third : 2 * third], pcm[2 * third :]):
            send(ws, "input_audio_buffer.append", audio=base64.b64encode(chunk).decode())
        send(ws, "input_audio_buffer.commit")
        committed, created = recv(ws), recv(ws)
        assert committed["type"] == "input_audio_buffer.committed"
        assert created["type"] == "conversation.item.created"
        assert created["item"]["id"] == committed["item_id"]
        assert created["item"]["content"][0]["type"] == "input_audio"
        send(ws, "response.create")
        events = until(ws, "response.done")
    text = "".join(e["delta"] for e in of(events, "response.text.delta"))
    assert text and text == chat.choices[0].message.content  # resampled as chat audio is
    assert not of(events, "response.audio.delta")
    assert events[-1]["response"]["status"] in ("completed", "incomplete")
    speech_server.wait_idle()


def _open_requests(server: PipelineServer) -> float:
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    match = re.search(r"^omnistage_pipeline_open_requests (\S+)$", metrics, re.MULTILINE)
    assert match is not None
    held = re.findall(r"^omnistage_stage_resources_held\{.*\} (\S+)$", metrics, re.MULTILINE)
    assert held and all(float(v) == 0 for v in held), metrics
    return float(match.group(1))


LONG = {"max_response_output_tokens": "inf"}


def start_long_response(ws, until_event: str) -> str:
    """Say hello and start a response with no token limit; its id once `until_event` came."""
    send(ws, "conversation.item.create", item=user_text(HELLO))
    recv(ws)
    send(ws, "response.create", response=LONG)
    return until(ws, until_event)[0]["response"]["id"]


def test_a_new_response_or_a_cancel_interrupts_the_running_one(
    speech_server: PipelineServer, monkeypatch: pytest.MonkeyPatch
):
    aborted = record_aborts(speech_server, monkeypatch)
    with realtime(speech_server) as ws:
        first = start_long_response(ws, "response.audio_transcript.delta")
        send(
            ws,
            "response.create",
            response={"modalities": ["text"], "max_response_output_tokens": 2},
        )
        events = until(ws, "response.created")
        done = of(events, "response.done")
        assert len(done) == 1 and done[0]["response"]["id"] == first
        assert done[0]["response"]["status"] == "cancelled"
        assert done[0]["response"]["status_details"]["reason"] == "client_cancelled"
        second = until(ws, "response.done")[-1]["response"]
        assert second["status"] in ("completed", "incomplete") and second["id"] != first

        send(ws, "response.create", response=LONG)
        third = until(ws, "response.audio_transcript.delta")[0]["response"]["id"]
        send(ws, "response.cancel", response_id=third)
        done = until(ws, "response.done")[-1]["response"]
        assert (done["id"], done["status"]) == (third, "cancelled")

        send(ws, "response.create", response=LONG)
        fourth = until(ws, "response.audio_transcript.delta")[0]["response"]["id"]
        send(ws, "input_audio_buffer.append", audio=base64.b64encode(_sine_pcm16(0.2)).decode())
        send(ws, "input_audio_buffer.commit")  # the user speaks over the response
        events = until(ws, "input_audio_buffer.committed")
        done = of(events, "response.done")[0]["response"]
        assert (done["id"], done["status"]) == (fourth, "cancelled")
        assert done["status_details"]["reason"] == "turn_detected"
    speech_server.wait_idle()
    assert {first, third, fourth} <= set(aborted)
    assert _open_requests(speech_server) == 0


@pytest.mark.parametrize(
    ("event", "param"),
    [
        ({"type": "no.such.event"}, "type"),
        ({"type": "input_audio_buffer.append", "audio": "not base64!"}, "audio"),
        ({"type": "input_audio_buffer.append", "audio": "AAA="}, "audio"),  # 2 bytes: ok
        ({"type": "session.update", "session": {"voice": "alloy"}}, "session.voice"),
        ({"type": "session.update", "session": {"temperature": "hot"}}, "session.temperature"),
        ({"type": "session.update", "session": {"colour": "red"}}, "session.colour"),
        ({"type": "session.update", "session": {"turn_detection": {}}}, "session.turn_detection"),
        ({"type": "response.create", "response": {"voice": "nobody"}}, "response.voice"),
        ({"type": "response.create", "response": {"modalities": ["audio"]}}, "response.modalities"),
        ({"type": "input_audio_buffer.commit"}, "input_audio_buffer"),
        ({"type": "response.cancel"}, "response_id"),
        ({"type": "conversation.item.delete", "item_id": "item_x"}, "item_id"),
        (
            {
                "type": "conversation.item.create",
                "item": {"role": "user", "content": [{"type": "text", "text": "x"}]},
            },
            "item.content[0].type",
        ),
        (
            {
                "type": "conversation.item.create",
                "item": {"role": "user", "content": [{"type": "input_text"}]},
            },
            "item.content[0].text",
        ),
        (
            {
                "type": "conversation.item.create",
                "item": {"role": "user", "content": [{"type": "input_audio", "audio": "AA"}]},
            },
            "item.content[0].audio",
        ),
    ],
)
def test_bad_events_are_error_events_naming_the_field_and_the_session_goes_on(
    speech_server: PipelineServer, event: dict[str, Any], param: str
):
    with realtime(speech_server) as ws:
        ws.send(json.dumps({**event, "event_id": "evt_1"}))
        if event.get("audio") == "AAA=":  # valid pcm16: appended, no answer
            send(ws, "input_audio_buffer.clear")
            assert recv(ws)["type"] == "input_audio_buffer.cleared"
            return
        error = recv(ws)
        assert error["type"] == "error", error
        assert error["error"]["param"] == param, error
        assert error["error"]["event_id"] == "evt_1"
        assert error["error"]["type"] == "invalid_request_error" and error["error"]["message"]
        # the session goes on
        send(ws, "conversation.item.create", item=user_text(HELLO))
        assert recv(ws)["type"] == "conversation.item.created"
        send(
            ws,
            "response.create",
            response={"modalities": ["text"], "max_response_output_tokens": 1},
        )
        assert until(ws, "response.done")[-1]["response"]["status"] in ("completed", "incomplete")


def test_a_prompt_the_model_refuses_fails_the_response_and_the_session_goes_on(
    speech_server: PipelineServer,
):
    with realtime(speech_server) as ws:
        send(ws, "session.update", session={"instructions": "Be brief. " * 20000})
        recv(ws)
        send(ws, "conversation.item.create", item=user_text(HELLO))
        recv(ws)
        send(ws, "response.create", event_id="evt_9")
        events = until(ws, "response.done")
        (error,) = of(events, "error")
        assert error["error"]["param"] == "conversation", error
        assert error["error"]["event_id"] == "evt_9"
        assert "context" in error["error"]["message"]
        assert events[-1]["response"]["status"] == "failed"
        send(ws, "session.update", session={"instructions": "", "max_response_output_tokens": 1})
        recv(ws)
        send(ws, "response.create", response={"modalities": ["text"]})
        assert until(ws, "response.done")[-1]["response"]["status"] in ("completed", "incomplete")
    speech_server.wait_idle()


def test_malformed_messages_and_an_unknown_model(speech_server: PipelineServer):
    with realtime(speech_server) as ws:
        ws.send("{not json")
        assert recv(ws)["type"] == "error"
        ws.send(b"\x00\x01")
        assert recv(ws)["type"] == "error"
        send(ws, "input_audio_buffer.clear")
        assert recv(ws)["type"] == "input_audio_buffer.cleared"
    url = f"ws://127.0.0.1:{speech_server.port}/v1/realtime?model=gpt-4o-realtime"
    with connect(url) as ws:
        error = recv(ws)
        assert error["error"]["code"] == "model_not_found" and error["error"]["param"] == "model"


def test_a_client_that_goes_away_mid_response_leaks_nothing(
    speech_server: PipelineServer, monkeypatch: pytest.MonkeyPatch
):
    aborted = record_aborts(speech_server, monkeypatch)
    with realtime(speech_server) as ws:
        response = start_long_response(ws, "response.audio.delta")
    speech_server.wait_idle()
    assert response in aborted
    assert _open_requests(speech_server) == 0
