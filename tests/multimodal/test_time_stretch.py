"""`time_stretch` (WSOLA): the tempo changes by `speed`, the pitch does not, speed 1 is the
identity, and speeds outside 0.25-4 are refused naming `speed`."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.multimodal.time_stretch import time_stretch

RATE = 24000


def _tone(seconds: float, hz: float) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _peak_hz(x: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.fft.rfftfreq(x.size, 1 / RATE)[np.argmax(spectrum)])


@pytest.mark.parametrize("speed", [0.5, 0.8, 1.5, 2.0, 4.0])
def test_length_scales_and_pitch_stays(speed):
    tone = _tone(1.0, 440.0)
    out = time_stretch(tone, RATE, speed)
    assert out.dtype == np.float32 and out.size == round(tone.size / speed)
    assert abs(_peak_hz(out) - 440.0) < 5.0  # bins are 1/duration wide
    assert np.abs(out).max() < 0.6  # no overlap blow-up
    # Away from the edges the envelope stays the tone's.
    middle = out[out.size // 4 : 3 * out.size // 4]
    assert 0.3 < np.sqrt(np.mean(middle**2)) < 0.4


def test_speed_one_is_the_identity_and_bad_speeds_name_the_field():
    tone = _tone(0.3, 220.0)
    assert np.array_equal(time_stretch(tone, RATE, 1.0), tone)
    for speed in (0.1, 4.5):
        with pytest.raises(ValueError, match="^speed: "):
            time_stretch(tone, RATE, speed)
