"""Speech at another speed, same pitch: WSOLA (waveform-similarity overlap-add).

`time_stretch(samples, rate, speed)` plays mono speech `speed` times as fast (2.0: half
the duration) without changing its pitch, as OpenAI's `speed` does: windows of ~25 ms
are taken from the input every `hop * speed` samples, each shifted by up to ±`hop / 2`
to the offset whose waveform best continues the previous window (the largest
cross-correlation), and overlap-added with a Hann window every `hop` samples. Output
length is `round(len(samples) / speed)`.
"""

from __future__ import annotations

import numpy as np

MIN_SPEED, MAX_SPEED = 0.25, 4.0
WINDOW_S = 0.025


def time_stretch(samples: np.ndarray, rate: int, speed: float) -> np.ndarray:
    """`samples` (float, mono) at `speed` times the tempo; ValueError naming `speed`
    outside 0.25-4."""
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise ValueError(f"speed: must be between {MIN_SPEED} and {MAX_SPEED}, got {speed}")
    x = np.asarray(samples, dtype=np.float32).reshape(-1)
    if speed == 1.0 or x.size == 0:
        return x
    window = max(16, int(rate * WINDOW_S) // 2 * 2)
    hop, tolerance = window // 2, window // 4
    target = max(1, round(x.size / speed))
    padded = np.concatenate(
        [np.zeros(tolerance + window, np.float32), x, np.zeros(2 * window, np.float32)]
    )
    offset = tolerance + window  # where x[0] sits in `padded`
    out = np.zeros(target + 2 * window, np.float32)
    norm = np.zeros_like(out)
    hann = np.hanning(window).astype(np.float32)
    previous = offset  # input start of the last window placed
    for n, out_start in enumerate(range(0, target + window, hop)):
        ideal = offset + int(round(n * hop * speed))
        start = ideal if n == 0 else _best_start(padded, previous + hop, ideal, window, tolerance)
        out[out_start : out_start + window] += hann * padded[start : start + window]
        norm[out_start : out_start + window] += hann
        previous = start
    out = out[:target] / np.maximum(norm[:target], 1e-3)
    return out.astype(np.float32)


def _best_start(x: np.ndarray, natural: int, ideal: int, window: int, tolerance: int) -> int:
    """The start near `ideal` whose window best matches the natural continuation."""
    lo = max(0, ideal - tolerance)
    hi = min(x.size - window, ideal + tolerance)
    if hi <= lo or natural + window > x.size:
        return min(max(ideal, 0), x.size - window)
    reference = x[natural : natural + window]
    candidates = np.lib.stride_tricks.sliding_window_view(x[lo : hi + window], window)
    return lo + int(np.argmax(candidates @ reference))
