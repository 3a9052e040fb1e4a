"""MiMo-Audio with streaming code2wav behind the real server, as `omnistage serve --model
demo-mimo-audio --deploy demo-mimo-audio-stream` runs it: a streamed chat completion with
audio brings its audio in several pieces (one per stream chunk with audio), which add up
to the same request's whole reply (greedy), and its text is the whole reply's."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import pytest
import soundfile

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.pipeline_client import PipelineClient
from omnistage.entrypoints.openai.pipeline_deploy import pipeline_deploy
from tests.server.conftest import PipelineServer, _ThreadedServer

MODEL = "demo-mimo-audio"
HELLO = [{"role": "user", "content": "Hello there."}]
ASK = dict(
    model=MODEL,
    messages=HELLO,
    modalities=["text", "audio"],
    audio={"format": "wav", "voice": "default"},
    max_tokens=60,
    temperature=0,
)


class _StreamServer(PipelineServer):
    def __init__(self) -> None:
        spec = pipeline_deploy(MODEL, "demo-mimo-audio-stream")
        assert spec is not None and spec.stage("code2wav").model_part == "code2wav_stream"
        client = PipelineClient(spec, in_process=True)
        self.name = MODEL
        _ThreadedServer.__init__(self, build_app(client, [MODEL], model_path=MODEL), client)


@pytest.fixture(scope="module")
def server() -> Iterator[PipelineServer]:
    with _StreamServer() as live:
        yield live


def test_streamed_chat_audio_comes_in_pieces_and_equals_the_whole(server) -> None:
    client = server.openai()
    whole = client.chat.completions.create(**ASK).choices[0].message
    samples, rate = soundfile.read(io.BytesIO(base64.b64decode(whole.audio.data)), dtype="int16")
    assert rate == 24000 and samples.size > 0
    events = []  # ("text" | "audio", payload) in arrival order
    for chunk in client.chat.completions.create(**ASK, stream=True):
        for choice in chunk.choices:
            if choice.delta.content:
                events.append(("text", choice.delta.content))
            sound = getattr(choice.delta, "audio", None)
            sound = sound if sound is None or isinstance(sound, dict) else sound.model_dump()
            if sound and sound.get("data"):
                events.append(("audio", base64.b64decode(sound["data"])))
    pieces = [p for kind, p in events if kind == "audio"]
    assert len(pieces) >= 2  # a piece per chunk with audio (whole segments: one, at the end)
    assert b"".join(pieces) == samples.tobytes()
    assert "".join(p for kind, p in events if kind == "text") == whole.content
    server.wait_idle()
