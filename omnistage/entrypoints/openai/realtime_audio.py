"""Input audio of a realtime session: base64 pcm16 as the client sends it, the input
audio buffer it appends to and commits, and the WAV a committed clip becomes.

The client's audio is 16-bit little-endian mono PCM at `INPUT_RATE` (24 kHz, OpenAI's
pcm16). A committed clip enters the prompt as the chat route's `input_audio` part
(a base64 WAV at that rate), so it takes the same path as chat audio: decoded, bounded
(`OMNISTAGE_MAX_AUDIO_SECONDS`) and resampled to the rate the model's audio encoder
takes (`multimodal.media.load_audio`).
"""

from __future__ import annotations

import base64
import binascii

from omnistage.entrypoints.openai.realtime_events import EventError
from omnistage.entrypoints.openai.serving_speech import wav_header
from omnistage.multimodal.media import max_audio_seconds

INPUT_RATE = 24000
"""The sample rate of the client's pcm16 (OpenAI's)."""
MIN_COMMIT_MS = 100
"""A commit of less audio than this is refused (as OpenAI does)."""


def decode_pcm16(data: str, param: str) -> bytes:
    """The bytes of base64 pcm16 `data`; EventError naming `param` when it is not base64
    or not whole 16-bit samples."""
    try:
        pcm = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise EventError(f"{param}: not valid base64", param, "invalid_value") from None
    if len(pcm) % 2:
        raise EventError(
            f"{param}: pcm16 audio must be whole 16-bit samples (an even number of bytes), "
            f"got {len(pcm)} bytes",
            param,
            "invalid_value",
        )
    return pcm


def check_length(num_bytes: int, param: str) -> None:
    """EventError naming `param` for `num_bytes` of pcm16, over the server's bound on audio
    input."""
    seconds, limit = num_bytes / 2 / INPUT_RATE, max_audio_seconds()
    if seconds > limit:
        raise EventError(
            f"{param}: {seconds:.1f} s of audio, over the limit of {limit:g} s "
            "(OMNISTAGE_MAX_AUDIO_SECONDS)",
            param,
            "invalid_value",
        )


def wav_base64(pcm: bytes, rate: int = INPUT_RATE) -> str:
    """`pcm` (16-bit mono at `rate`) as a base64 WAV file: a chat `input_audio` part's data."""
    return base64.b64encode(wav_header(rate, len(pcm)) + pcm).decode("ascii")


class InputAudioBuffer:
    """The audio the client appended since its last commit or clear."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._size = 0

    def append(self, data: str) -> None:
        """Append base64 pcm16 `data`; EventError naming `audio` when it is not pcm16 or
        the buffer would pass the bound on audio input (the buffer is then unchanged)."""
        pcm = decode_pcm16(data, "audio")
        check_length(self._size + len(pcm), "audio")
        self._chunks.append(pcm)
        self._size += len(pcm)

    def clear(self) -> None:
        self._chunks, self._size = [], 0

    def take(self) -> bytes:
        """The buffer's audio (it is emptied); EventError when it holds under
        `MIN_COMMIT_MS`."""
        ms = self._size / 2 / INPUT_RATE * 1000
        if ms < MIN_COMMIT_MS:
            raise EventError(
                f"input_audio_buffer: buffer too small: expected at least {MIN_COMMIT_MS} ms "
                f"of audio, but it holds {ms:.2f} ms",
                "input_audio_buffer",
                "input_audio_buffer_commit_empty",
            )
        pcm = b"".join(self._chunks)
        self.clear()
        return pcm
