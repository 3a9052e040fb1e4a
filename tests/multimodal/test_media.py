"""Loading audio and images: formats, mono mixing, resampling, and refusals of bad input."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import soundfile
import soxr
import torch
from PIL import Image

from omnistage.multimodal.media import decode_data_url, load_audio, load_image, resolve_url


def _tone(freq: float, rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return 0.5 * np.sin(2 * np.pi * freq * t)


# -- audio -------------------------------------------------------------------------------


def test_wav_file_is_mixed_to_mono_and_resampled(tmp_path):
    left, right = _tone(440, 48000, 0.5), _tone(440, 48000, 0.5) * 0.5
    path = tmp_path / "stereo.wav"
    soundfile.write(path, np.stack([left, right], axis=1), 48000, subtype="PCM_16")
    out = load_audio(path)
    assert out.dtype == np.float32 and out.ndim == 1
    assert out.shape[0] == 8000  # 0.5 s at 16 kHz
    # The same tone sampled at 16 kHz directly (the mean of the channels: 0.75 x), away from
    # the edges where the resampler's filter sees the signal start and stop.
    expected = 0.75 * _tone(440, 16000, 0.5)
    np.testing.assert_allclose(out[200:-200], expected[200:-200], atol=2e-3)
    # Exactly what mono-mixing the decoded file and soxr "HQ" give.
    decoded, rate = soundfile.read(path, dtype="float64", always_2d=True)
    np.testing.assert_array_equal(
        out, soxr.resample(decoded.mean(axis=1), rate, 16000, "HQ").astype(np.float32)
    )


def test_flac_bytes_at_the_target_rate_are_unchanged(tmp_path):
    samples = (_tone(300, 16000, 0.25) * 32767).astype(np.int16)
    buf = io.BytesIO()
    soundfile.write(buf, samples, 16000, format="FLAC")
    out = load_audio(buf.getvalue())
    np.testing.assert_array_equal(out, (samples / 32768.0).astype(np.float32))


def test_arrays_tensors_and_pcm_with_their_rate():
    tone = _tone(440, 22050, 0.2)
    from_array = load_audio(tone, 22050)
    assert from_array.shape == (3200,)
    np.testing.assert_array_equal(load_audio((tone, 22050)), from_array)
    np.testing.assert_array_equal(load_audio(torch.from_numpy(tone), 22050), from_array)
    pcm = (tone * 32767).astype(np.int16)
    np.testing.assert_allclose(load_audio(pcm, 22050), from_array, atol=1e-4)
    stereo = np.stack([tone, -tone], axis=1)  # [samples, channels]: mixes to silence
    np.testing.assert_allclose(load_audio(stereo, 22050), 0.0, atol=1e-6)
    same_rate = load_audio(tone.astype(np.float32), 16000, target_rate=16000)
    np.testing.assert_array_equal(same_rate, tone.astype(np.float32))


@pytest.mark.parametrize(
    ("source", "rate", "match"),
    [
        (np.zeros(100), 0, "sampling_rate: must be a positive number"),
        (np.zeros(100), -16000, "sampling_rate: must be a positive number"),
        (np.zeros(100), float("nan"), "sampling_rate: must be a positive number"),
        (np.zeros(100), "16k", "sampling_rate: expected a number"),
        (np.zeros(100), None, "needs its sampling_rate"),
        (np.zeros(0), 16000, "has no samples"),
        (np.zeros((2, 3, 4)), 16000, r"expected a 1-D \[samples\] or 2-D"),
        (np.zeros((2, 1000)), 16000, "transpose"),
        (np.array([0.0, np.nan, 0.0]), 16000, "finite"),
        (np.zeros(10, dtype=np.uint8), 16000, "unsupported sample type"),
        ([0.0, 0.1], 16000, "expected a file path, file bytes or an array"),
        (b"", None, "empty"),
        (b"RIFF not really a wav file", None, "unsupported audio format"),
        ((np.zeros(10), 16000, 1), None, r"\(samples, sampling_rate\)"),
        (np.zeros(1), 48000, "too short to resample"),
    ],
)
def test_bad_audio_is_refused(source, rate, match):
    with pytest.raises(ValueError, match=match):
        load_audio(source, rate)


def test_bad_audio_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_audio(tmp_path / "missing.wav")
    text = tmp_path / "notes.wav"
    text.write_text("these are not samples")
    with pytest.raises(ValueError, match="unsupported audio format or corrupt file"):
        load_audio(text)
    with pytest.raises(ValueError, match="sampling_rate is read from the file"):
        load_audio(text, 16000)


# -- images ------------------------------------------------------------------------------


def test_images_from_files_bytes_pil_and_arrays(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)
    path = tmp_path / "img.png"
    Image.fromarray(pixels).save(path)
    for source in (path, str(path), path.read_bytes(), Image.fromarray(pixels), pixels):
        image = load_image(source)
        assert image.size == (30, 20)
        np.testing.assert_array_equal(np.asarray(image.convert("RGB")), pixels)
    assert load_image(pixels[:, :, 0]).mode == "L"
    assert load_image(pixels[:, :, :1]).mode == "L"
    rgba = np.concatenate([pixels, np.full((20, 30, 1), 255, np.uint8)], axis=2)
    assert load_image(rgba).mode == "RGBA"  # RGB conversion is the image processor's job


@pytest.mark.parametrize(
    ("source", "match"),
    [
        (b"\x89PNG\r\n\x1a\n broken", "cannot decode"),
        (b"", "empty"),
        (np.zeros((4, 4, 3), dtype=np.float32), "must be uint8"),
        (np.zeros((4, 4, 2), dtype=np.uint8), r"\[H, W\] or \[H, W, C\]"),
        (np.zeros((1, 4, 4, 3), dtype=np.uint8), r"\[H, W\] or \[H, W, C\]"),
        (np.zeros((0, 4, 3), dtype=np.uint8), "empty image array"),
        (3.5, "expected a file path, file bytes, a PIL image"),
    ],
)
def test_bad_images_are_refused(source, match):
    with pytest.raises(ValueError, match=match):
        load_image(source)


def test_missing_image_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_image(tmp_path / "missing.png")


# -- URLs --------------------------------------------------------------------------------


def test_urls_resolve_locally_or_are_refused(tmp_path):
    payload = b"\x00\x01payload"  # of no type we check (see the test of declared types)
    url = "data:application/octet-stream;base64," + base64.b64encode(payload).decode()
    assert decode_data_url(url) == payload
    assert resolve_url(url) == payload
    assert resolve_url(f"file://{tmp_path}/a.wav") == f"{tmp_path}/a.wav"
    assert resolve_url("relative/a.png") == "relative/a.png"
    with pytest.raises(ValueError, match="remote"):
        resolve_url("https://example.com/a.png")
    with pytest.raises(ValueError, match="only base64"):
        decode_data_url("data:text/plain,hello")
    with pytest.raises(ValueError, match="invalid base64"):
        decode_data_url("data:audio/wav;base64,@@@")


def _wav(seconds: float, rate: int = 8000) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(int(seconds * rate), np.int16), rate, format="WAV")
    return buffer.getvalue()


def test_audio_over_the_duration_limit_is_refused_before_it_is_decoded(monkeypatch):
    read = []
    monkeypatch.setattr(soundfile, "read", lambda *a, **k: read.append(1) or (None, 0))
    with pytest.raises(ValueError, match=r"lasts 601.0 s, over the limit of 300 s"):
        load_audio(_wav(601))  # a 10-minute WAV: its header says so, nothing is decoded
    assert not read
    with pytest.raises(ValueError, match="over the limit"):
        load_audio(np.zeros(301 * 16000, np.float32), 16000)
    monkeypatch.setenv("OMNISTAGE_MAX_AUDIO_SECONDS", "2")
    with pytest.raises(ValueError, match="over the limit of 2 s"):
        load_audio(np.zeros(3 * 16000, np.float32), 16000)


def test_sample_rates_outside_the_bounds_are_refused():
    for rate in (10, 500, 400_000):
        with pytest.raises(ValueError, match="sampling_rate: .* Hz is outside"):
            load_audio(np.zeros(1000, np.float32), rate)


def test_an_image_over_the_pixel_limit_is_refused_before_it_is_decoded(monkeypatch):
    monkeypatch.setenv("OMNISTAGE_MAX_IMAGE_PIXELS", str(100 * 100))
    buffer = io.BytesIO()
    Image.new("L", (101, 100)).save(buffer, format="PNG")
    loads = []
    monkeypatch.setattr(Image.Image, "load", lambda self: loads.append(1))
    with pytest.raises(ValueError, match=r"101x100 = 10100 pixels, over the limit of 10000"):
        load_image(buffer.getvalue())
    assert not loads  # the header was enough
    with pytest.raises(ValueError, match="over the limit"):
        load_image(np.zeros((200, 200), np.uint8))


def test_decompression_bombs_are_refused_by_name():
    """PNGs of 9000 x 9000 (over our 64 Mi pixels) and 20000 x 20000 pixels (over Pillow's
    own limit, which refuses it while reading the header) that compress to under 1 MB."""
    for side, says in ((9000, "81000000 pixels, over the limit"), (20000, "too large")):
        buffer = io.BytesIO()
        Image.new("1", (side, side)).save(buffer, format="PNG")
        assert len(buffer.getvalue()) < 1_000_000
        with pytest.raises(ValueError, match=says):
            load_image(buffer.getvalue())


def test_bytes_that_contradict_their_declared_type_are_refused():
    png, jpeg, wav = io.BytesIO(), io.BytesIO(), _wav(0.1)
    Image.new("RGB", (4, 4)).save(png, format="PNG")
    Image.new("RGB", (4, 4)).save(jpeg, format="JPEG")

    def url(mime: str, data: bytes) -> str:
        return f"data:{mime};base64," + base64.b64encode(data).decode()

    assert decode_data_url(url("image/png", png.getvalue())) == png.getvalue()
    assert decode_data_url(url("image/jpg", jpeg.getvalue())) == jpeg.getvalue()  # an alias
    assert decode_data_url(url("audio/x-wav", wav)) == wav
    assert decode_data_url(url("application/octet-stream", wav)) == wav  # unknown: not checked
    with pytest.raises(ValueError, match="declared image/png, but the data is image/jpeg"):
        decode_data_url(url("image/png", jpeg.getvalue()))
    with pytest.raises(ValueError, match="declared audio/mpeg, but the data is audio/wav"):
        decode_data_url(url("audio/mpeg", wav))
    with pytest.raises(ValueError, match="declared image/gif, but the data does not begin"):
        decode_data_url(url("image/gif", b"plain text"))


def test_an_input_audio_part_whose_format_is_not_its_bytes_is_refused():
    from omnistage.multimodal.chat import _audio_source

    wav = base64.b64encode(_wav(0.1)).decode()
    assert _audio_source({"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}})
    part = {"type": "input_audio", "input_audio": {"data": wav, "format": "mp3"}}
    with pytest.raises(
        ValueError, match="input_audio.format: declared audio/mp3, but the data is audio/wav"
    ):
        _audio_source(part)
