"""Uploaded voices: reference clips a TTS model clones, kept on disk per model.

A voice is a reference clip (mono, 24 kHz, 1-30 s, not silent: `load_reference_audio`)
and, optionally, its transcript and a display name, stored under
`<cache dir>/voices/<model key>/<voice id>/` (`audio.wav` as 32-bit float, `meta.json`),
so voices survive a restart and every process serving the model (the server's
frontend, the talker stage) reads the same ones. Ids are `voice-` and 16 hex digits;
a voice is written to a temporary folder and renamed into place, so a reader never
sees half a voice.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from omnistage.cache import cache_root
from omnistage.multimodal.media import load_audio

SAMPLE_RATE = 24000
MIN_SECONDS = 1.0
MAX_SECONDS = 30.0
SILENCE_RMS = 1e-4
"""A clip whose RMS is below this (about -80 dBFS) is treated as silence."""
MAX_UPLOAD_BYTES = 16 * 1024 * 1024
MAX_TRANSCRIPT_CHARS = 2000
_ID = re.compile(r"^voice-[0-9a-f]{16}$")


def load_reference_audio(
    data: bytes | bytearray | np.ndarray, sample_rate: float | None = None
) -> np.ndarray:
    """A mono float32 clip at 24 kHz from file bytes (WAV, FLAC, ...: the rate is read from
    the file, `sample_rate` must be None) or from samples `[n]` / `[n, channels]` at
    `sample_rate`. Raises `ValueError` naming `ref_audio` for undecodable or non-finite
    data, a duration outside 1-30 s, or silence (RMS below `SILENCE_RMS`)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        if sample_rate is not None:
            raise ValueError("ref_audio: the sample rate is read from the file; pass none")
    elif not isinstance(data, np.ndarray):
        raise ValueError(
            f"ref_audio: expected audio file bytes or an array of samples, got "
            f"{type(data).__name__}"
        )
    elif sample_rate is None:
        raise ValueError("ref_audio: an array of samples needs its sample_rate")
    try:
        clip = load_audio(data, sample_rate, target_rate=SAMPLE_RATE)
    except ValueError as e:
        message = str(e).removeprefix("audio: ")
        raise ValueError(f"ref_audio: {message}") from e
    seconds = clip.size / SAMPLE_RATE
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise ValueError(
            f"ref_audio: the clip lasts {seconds:.2f} s; a reference clip must last "
            f"{MIN_SECONDS:g} to {MAX_SECONDS:g} s"
        )
    if not np.isfinite(clip).all():
        raise ValueError("ref_audio: samples must be finite (found NaN or infinity)")
    rms = float(np.sqrt(np.mean(np.square(clip, dtype=np.float64))))
    if rms < SILENCE_RMS:
        raise ValueError(
            f"ref_audio: the clip is silent (RMS {rms:.2e} < {SILENCE_RMS:g}); "
            "record the speaker's voice"
        )
    return clip


class VoiceStore:
    """The uploaded voices of one model (its checkpoint directory)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def for_model(cls, model_path: str | Path) -> VoiceStore:
        """The store of the checkpoint at `model_path`; for a converted view (a checkpoint
        in its own layout, `models/layout_cache.py`) the store of the folder it was made
        from, so uploads outlive a reconversion (a new converter or an edited file)."""
        from omnistage.models.layout_cache import layout_source

        path = layout_source(Path(model_path)) or Path(model_path).resolve()
        key = hashlib.sha256(str(path).encode()).hexdigest()[:16]
        return cls(cache_root() / "voices" / key)

    @staticmethod
    def is_voice_id(value: object) -> bool:
        return isinstance(value, str) and _ID.match(value) is not None

    def add(self, data: bytes, transcript: str | None = None, name: str | None = None) -> dict:
        """Store a clip (audio file bytes); its record. ValueError naming the field."""
        import soundfile

        if len(data) > MAX_UPLOAD_BYTES:
            raise ValueError(f"audio: {len(data)} bytes, over the limit of {MAX_UPLOAD_BYTES}")
        if transcript is not None and len(transcript) > MAX_TRANSCRIPT_CHARS:
            raise ValueError(f"text: over the limit of {MAX_TRANSCRIPT_CHARS} characters")
        if name is not None and not 0 < len(name) <= 100:
            raise ValueError("name: must be 1 to 100 characters")
        try:
            clip = load_reference_audio(bytes(data))
        except ValueError as e:
            raise ValueError("audio: " + str(e).removeprefix("ref_audio: ")) from e
        voice_id = f"voice-{secrets.token_hex(8)}"
        record = {
            "id": voice_id,
            "name": name or voice_id,
            "text": transcript or None,
            "seconds": round(clip.size / SAMPLE_RATE, 3),
            "created_at": int(time.time()),
            "created_ns": time.time_ns(),
        }
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=self.root, prefix=".new-"))
        soundfile.write(staging / "audio.wav", clip, SAMPLE_RATE, subtype="FLOAT")
        (staging / "meta.json").write_text(json.dumps(record))
        os.replace(staging, self.root / voice_id)
        return record

    def list(self) -> list[dict]:
        """Every voice's record, oldest first."""
        if not self.root.is_dir():
            return []
        records = [self.get(p.name) for p in self.root.iterdir() if self.is_voice_id(p.name)]
        return sorted((r for r in records if r), key=lambda r: (r.get("created_ns", 0), r["id"]))

    def get(self, voice_id: str) -> dict | None:
        if not self.is_voice_id(voice_id):
            return None
        try:
            return json.loads((self.root / voice_id / "meta.json").read_text())
        except (OSError, ValueError):
            return None

    def audio(self, voice_id: str) -> np.ndarray:
        """The voice's clip (float32, 24 kHz); ValueError naming `voice` if there is none."""
        import soundfile

        if self.get(voice_id) is None:
            raise ValueError(f"voice: no uploaded voice {voice_id!r}")
        clip, _ = soundfile.read(self.root / voice_id / "audio.wav", dtype="float32")
        return clip

    def delete(self, voice_id: str) -> bool:
        if self.get(voice_id) is None:
            return False
        shutil.rmtree(self.root / voice_id, ignore_errors=True)
        return True
