"""Streamed speech (pcm16 chunks) and whole files (WAV through libsndfile) hold the same
16-bit samples: `to_pcm16` converts floats exactly as libsndfile does."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf

from omnistage.entrypoints.openai.serving_speech import to_pcm16


def test_pcm16_chunks_equal_the_samples_of_a_whole_wav():
    rng = np.random.default_rng(0)
    samples = np.concatenate(
        [
            rng.uniform(-1.2, 1.2, 4000),
            [0.0, 1.0, -1.0, 0.5 / 32768, -0.5 / 32768, 1.5 / 32768, 32767.5 / 32768],
        ]
    ).astype(np.float32)
    buffer = io.BytesIO()
    sf.write(buffer, samples, 24000, subtype="PCM_16", format="WAV")
    buffer.seek(0)
    whole, _ = sf.read(buffer, dtype="int16")
    streamed = np.frombuffer(to_pcm16(samples), dtype="<i2")
    np.testing.assert_array_equal(streamed, whole)
