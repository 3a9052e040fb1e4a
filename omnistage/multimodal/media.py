"""Loading user media: audio clips and images, checked and normalised.

Audio comes in as a file (path or the file's bytes: WAV, FLAC, OGG, anything
libsndfile decodes) or as samples with their rate (a numpy array or torch tensor,
1-D `[samples]` or 2-D `[samples, channels]`, float or int16/int32 PCM). It is
mixed down to mono (mean of the channels) and resampled (soxr, "HQ") to the rate
the model's feature extractor expects; the result is a 1-D float32 array.

Images come in as a file (path or bytes: anything Pillow decodes), a PIL image,
or a uint8 array `[H, W]`, `[H, W, 1]`, `[H, W, 3]` or `[H, W, 4]`. The result is
a decoded PIL image in its own mode: colour conversion (e.g. RGBA -> RGB over
white) is left to the model's image processor, which does it exactly as
transformers does.

Everything a user can get wrong raises `ValueError` naming the problem, including media
over the bounds: audio longer than `max_audio_seconds()` (checked from the file's header,
before decoding) or at a rate outside `MIN_SAMPLE_RATE`..`MAX_SAMPLE_RATE`, images of
more than `max_image_pixels()` (checked from the header, so a decompression bomb is
refused before it is decoded). The two limits are read from the environment
(`OMNISTAGE_MAX_AUDIO_SECONDS`, `OMNISTAGE_MAX_IMAGE_PIXELS`) when set.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

AUDIO_FORMATS_HINT = "WAV, FLAC, OGG/Vorbis, MP3 and the other formats libsndfile decodes"
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 1000.0, 384000.0
DEFAULT_MAX_AUDIO_SECONDS = 300.0
DEFAULT_MAX_IMAGE_PIXELS = 64 * 1024 * 1024


class MediaTooLarge(ValueError):
    """Media over a bound (duration, pixels): the user's error, like any ValueError here."""


def max_audio_seconds() -> float:
    """The longest audio input accepted: `OMNISTAGE_MAX_AUDIO_SECONDS`, else 5 minutes."""
    return float(os.environ.get("OMNISTAGE_MAX_AUDIO_SECONDS", DEFAULT_MAX_AUDIO_SECONDS))


def max_image_pixels() -> int:
    """The largest image input accepted, in pixels: `OMNISTAGE_MAX_IMAGE_PIXELS`, else 64 Mi."""
    return int(os.environ.get("OMNISTAGE_MAX_IMAGE_PIXELS", DEFAULT_MAX_IMAGE_PIXELS))


def _check_duration(frames: int, rate: float, what: str) -> None:
    seconds, limit = frames / rate, max_audio_seconds()
    if seconds > limit:
        raise MediaTooLarge(
            f"audio: {what} lasts {seconds:.1f} s, over the limit of {limit:g} s "
            "(OMNISTAGE_MAX_AUDIO_SECONDS)"
        )


def _check_pixels(width: int, height: int, what: str) -> None:
    limit = max_image_pixels()
    if width * height > limit:
        raise MediaTooLarge(
            f"image: {what} is {width}x{height} = {width * height} pixels, over the limit of "
            f"{limit} (OMNISTAGE_MAX_IMAGE_PIXELS)"
        )


def _describe(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        return f"{os.fspath(source)!r}"
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{len(source)} bytes>"
    return f"<{type(source).__name__}>"


def decode_data_url(url: str) -> bytes:
    """The payload of a `data:[<mime>][;base64],<data>` URL; a payload that is not what a
    known `<mime>` says (`MEDIA_SIGNATURES`) is refused."""
    if not url.startswith("data:") or "," not in url:
        raise ValueError("data URL: expected 'data:<mime>;base64,<data>'")
    header, payload = url[5:].split(",", 1)
    if not header.endswith(";base64"):
        raise ValueError("data URL: only base64-encoded data URLs are supported")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"data URL: invalid base64 payload ({e})") from e
    check_media_type(data, header.removesuffix(";base64").lower(), "data URL")
    return data


def _is_mp3(data: bytes) -> bool:
    return data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0)


MEDIA_SIGNATURES: dict[str, Any] = {
    "image/png": lambda d: d[:8] == b"\x89PNG\r\n\x1a\n",
    "image/jpeg": lambda d: d[:3] == b"\xff\xd8\xff",
    "image/gif": lambda d: d[:6] in (b"GIF87a", b"GIF89a"),
    "image/webp": lambda d: d[:4] == b"RIFF" and d[8:12] == b"WEBP",
    "image/bmp": lambda d: d[:2] == b"BM",
    "audio/wav": lambda d: d[:4] == b"RIFF" and d[8:12] == b"WAVE",
    "audio/flac": lambda d: d[:4] == b"fLaC",
    "audio/ogg": lambda d: d[:4] == b"OggS",
    "audio/mpeg": _is_mp3,
}
"""How the bytes of each media type begin (the types whose declaration is checked)."""
MEDIA_ALIASES = {
    "image/jpg": "image/jpeg",
    "audio/x-wav": "audio/wav",
    "audio/wave": "audio/wav",
    "audio/vnd.wave": "audio/wav",
    "audio/mp3": "audio/mpeg",
    "audio/x-flac": "audio/flac",
}


def check_media_type(data: bytes, declared: str, what: str) -> None:
    """Refuse `data` whose declared media type (a known one) its bytes contradict."""
    mime = MEDIA_ALIASES.get(declared, declared)
    matches = MEDIA_SIGNATURES.get(mime)
    if matches is not None and data and not matches(data):
        found = next((m for m, sign in MEDIA_SIGNATURES.items() if sign(data)), None)
        actually = f"the data is {found}" if found else f"the data does not begin as {mime} does"
        raise ValueError(f"{what}: declared {declared}, but {actually}")


def resolve_url(url: str) -> str | bytes:
    """A local file path (plain or `file://`) or the bytes of a `data:` URL; remote URLs are
    refused (nothing is downloaded at run time)."""
    if not isinstance(url, str) or not url:
        raise ValueError("url: expected a non-empty string")
    if url.startswith("data:"):
        return decode_data_url(url)
    if url.startswith("file://"):
        return url[len("file://") :]
    if "://" in url:
        raise ValueError(
            f"url: {url[:60]!r} is remote; only local paths, file:// and data: URLs are accepted"
        )
    return url


# -- audio -------------------------------------------------------------------------------


def _check_rate(rate: Any, what: str) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.integer, np.floating)):
        raise ValueError(f"{what}: expected a number, got {type(rate).__name__}")
    rate = float(rate)
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"{what}: must be a positive number of samples per second, got {rate}")
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise ValueError(
            f"{what}: {rate:g} Hz is outside {MIN_SAMPLE_RATE:g}..{MAX_SAMPLE_RATE:g} Hz"
        )
    return rate


def _pcm_to_float(samples: np.ndarray) -> np.ndarray:
    if samples.dtype.kind == "f":
        return samples.astype(np.float64, copy=False)
    if samples.dtype == np.int16:
        return samples.astype(np.float64) / 32768.0
    if samples.dtype == np.int32:
        return samples.astype(np.float64) / 2147483648.0
    raise ValueError(
        f"audio: unsupported sample type {samples.dtype} (use float, int16 or int32 samples)"
    )


def _read_audio_file(source: str | os.PathLike | bytes) -> tuple[np.ndarray, float]:
    import soundfile

    what = _describe(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise ValueError("audio: the audio data is empty")
        handle: Any = io.BytesIO(bytes(source))
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"audio: no such file {what}")
        handle = str(path)
    try:
        info = soundfile.info(handle)
        _check_duration(info.frames, float(info.samplerate), what)
        if not isinstance(handle, str):
            handle.seek(0)
        data, rate = soundfile.read(handle, dtype="float64", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as e:
        # libsndfile's own words, without its "Error opening <_io.BytesIO object at 0x...>"
        reason = getattr(e, "error_string", None) or e
        raise ValueError(
            f"audio: cannot decode {what}: unsupported audio format or corrupt file "
            f"(supported: {AUDIO_FORMATS_HINT}; {reason})"
        ) from e
    return data, float(rate)


def _as_samples(samples: Any) -> np.ndarray:
    try:
        import torch

        if isinstance(samples, torch.Tensor):
            samples = samples.detach().cpu()
            if samples.dtype == torch.bfloat16:
                samples = samples.float()
            samples = samples.numpy()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    if not isinstance(samples, np.ndarray):
        raise ValueError(
            f"audio: expected a file path, file bytes or an array of samples, got "
            f"{type(samples).__name__}"
        )
    if samples.ndim == 1:
        samples = samples[:, None]
    elif samples.ndim == 2:
        if samples.shape[1] > samples.shape[0]:
            raise ValueError(
                f"audio: a 2-D array must be [samples, channels]; got shape {list(samples.shape)} "
                "(more channels than samples: transpose a [channels, samples] array)"
            )
    else:
        raise ValueError(
            f"audio: expected a 1-D [samples] or 2-D [samples, channels] array, got shape "
            f"{list(samples.shape)}"
        )
    return _pcm_to_float(samples)


def resample_audio(waveform: np.ndarray, orig_rate: float, target_rate: float) -> np.ndarray:
    """Resample a 1-D waveform (soxr, high quality); float32 out."""
    orig_rate = _check_rate(orig_rate, "sampling_rate")
    target_rate = _check_rate(target_rate, "target sampling rate")
    waveform = np.asarray(waveform)
    if orig_rate == target_rate:
        return waveform.astype(np.float32, copy=False)
    import soxr

    try:
        out = soxr.resample(waveform.astype(np.float64, copy=False), orig_rate, target_rate, "HQ")
    except (ValueError, RuntimeError) as e:
        raise ValueError(
            f"sampling_rate: cannot resample from {orig_rate:g} Hz to {target_rate:g} Hz ({e})"
        ) from e
    return np.ascontiguousarray(out, dtype=np.float32)


def load_audio(
    source: Any, sampling_rate: float | None = None, *, target_rate: int = 16000
) -> np.ndarray:
    """A mono float32 waveform at `target_rate` Hz.

    `source`: a file path, the bytes of an audio file, an array/tensor of samples (then
    `sampling_rate` is required), or an `(array, sampling_rate)` pair.
    """
    if isinstance(source, tuple):
        if len(source) != 2:
            raise ValueError("audio: a tuple must be (samples, sampling_rate)")
        if sampling_rate is not None:
            raise ValueError("audio: sampling_rate given twice (in the tuple and as an argument)")
        source, sampling_rate = source
    if isinstance(source, (str, os.PathLike, bytes, bytearray, memoryview)):
        if sampling_rate is not None:
            raise ValueError("audio: sampling_rate is read from the file; do not pass one")
        data, rate = _read_audio_file(source)
    else:
        if sampling_rate is None:
            raise ValueError("audio: an array of samples needs its sampling_rate")
        rate = _check_rate(sampling_rate, "sampling_rate")
        data = _as_samples(source)
        _check_duration(data.shape[0], rate, _describe(source))
    if data.shape[0] == 0 or data.shape[1] == 0:
        raise ValueError(f"audio: {_describe(source)} has no samples")
    if not np.isfinite(data).all():
        raise ValueError("audio: samples must be finite (found NaN or infinity)")
    mono = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    out = resample_audio(mono, rate, target_rate)
    if out.size == 0:
        raise ValueError(
            f"audio: {data.shape[0]} samples at {rate:g} Hz are too short to resample to "
            f"{target_rate} Hz"
        )
    return out


# -- images ------------------------------------------------------------------------------


def load_image(source: Any):
    """A decoded PIL image from a path, file bytes, a PIL image or a uint8 array [H, W(, C)]."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(source, Image.Image):
        image = source
    elif isinstance(source, (str, os.PathLike, bytes, bytearray, memoryview)):
        what = _describe(source)
        if isinstance(source, (bytes, bytearray, memoryview)):
            if len(source) == 0:
                raise ValueError("image: the image data is empty")
            handle: Any = io.BytesIO(bytes(source))
        else:
            path = Path(source)
            if not path.is_file():
                raise ValueError(f"image: no such file {what}")
            handle = path
        try:
            image = Image.open(handle)  # reads the header only
            _check_pixels(*image.size, what)
            image.load()
        except MediaTooLarge:
            raise
        except UnidentifiedImageError as e:  # its message shows the handle's repr and address
            raise ValueError(f"image: cannot decode {what} (not an image Pillow reads)") from e
        except (OSError, SyntaxError, ValueError) as e:
            raise ValueError(f"image: cannot decode {what} ({e})") from e
        except Image.DecompressionBombError as e:  # over Pillow's own limit too
            raise MediaTooLarge(f"image: {what} is too large to decode ({e})") from e
    else:
        image = Image.fromarray(_image_array(source))
    width, height = image.size
    _check_pixels(width, height, _describe(source))
    if width == 0 or height == 0:
        raise ValueError(f"image: empty image ({width}x{height})")
    return image


def _image_array(source: Any) -> np.ndarray:
    try:
        import torch

        if isinstance(source, torch.Tensor):
            source = source.detach().cpu().numpy()
    except ImportError:  # pragma: no cover
        pass
    if not isinstance(source, np.ndarray):
        raise ValueError(
            "image: expected a file path, file bytes, a PIL image or a uint8 array, got "
            f"{type(source).__name__}"
        )
    if source.dtype != np.uint8:
        raise ValueError(f"image: an image array must be uint8, got {source.dtype}")
    shape = list(source.shape)
    if source.ndim == 3 and source.shape[2] == 1:
        source = source[:, :, 0]
    if not (source.ndim == 2 or (source.ndim == 3 and source.shape[2] in (3, 4))):
        raise ValueError(
            f"image: an image array must be [H, W] or [H, W, C] with C in 1, 3, 4; got shape {shape}"
        )
    if source.shape[0] == 0 or source.shape[1] == 0:
        raise ValueError(f"image: empty image array of shape {shape}")
    return np.ascontiguousarray(source)
