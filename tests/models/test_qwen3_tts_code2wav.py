"""Qwen3-TTS's speech-tokenizer decoder (our port) as a generation-stage model: parity with
the official `qwen-tts` decode (a fixture the reference venv wrote, see
`tests/fixtures/qwen3_tts/make_codec_fixture.py`), streamed chunks that add up to the
whole decode (with re-decoded left context, and through a stream's kept state: each
chunk decoded once, in order, a failed call leaving the stream as it was), the decode cut
at the end frame, bad codes and a missing tokenizer named."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import safetensors.torch
import torch

from omnistage.families.qwen3_tts.code2wav import Qwen3TTSCode2Wav
from omnistage.families.qwen3_tts.tiny_codec import (
    TINY_CODEBOOK_SIZE,
    TINY_NUM_QUANTIZERS,
    write_tiny_speech_tokenizer,
)
from omnistage.models.generation import GenerationItem
from tests.models.stream_items import (
    assert_a_failed_call_leaves_the_stream,
    assert_two_chunks_in_one_call_decode_in_order,
    stream_items,
)

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "qwen3_tts" / "codec_decode.pt"


@pytest.fixture(scope="module")
def reference() -> dict:
    return torch.load(FIXTURE)


def _load(directory: Path, seed: int, dtype: torch.dtype) -> Qwen3TTSCode2Wav:
    write_tiny_speech_tokenizer(directory, seed=seed, dtype=dtype)
    return Qwen3TTSCode2Wav.from_checkpoint(directory, None, dtype)


@pytest.fixture(scope="module")
def vocoder32(tmp_path_factory, reference) -> Qwen3TTSCode2Wav:
    return _load(
        tmp_path_factory.mktemp("qwen3-tts-c2w32"), reference["weight_seed"], torch.float32
    )


@pytest.fixture(scope="module")
def vocoder(tmp_path_factory) -> Qwen3TTSCode2Wav:
    return _load(tmp_path_factory.mktemp("qwen3-tts-c2w64"), 0, torch.float64)


def codes(frames: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY_CODEBOOK_SIZE, (frames, TINY_NUM_QUANTIZERS), generator=g)


def test_whole_decode_matches_the_reference(vocoder32, reference, tmp_path):
    # The same weights the reference decoded (re-made here from the same seed).
    folder = write_tiny_speech_tokenizer(tmp_path, seed=reference["weight_seed"])
    weights = safetensors.torch.load_file(str(folder / "model.safetensors"))
    checksum = sum(float(v.double().abs().sum()) for k, v in weights.items() if k[:8] == "decoder.")
    assert checksum == pytest.approx(reference["decoder_weight_abs_sum"], rel=1e-12)

    frames, expected = reference["codes"], reference["wav"]
    (ours,) = vocoder32.generate([GenerationItem(frames)])
    assert vocoder32.sample_rate == reference["sample_rate"] == 24000
    assert ours.shape == expected.shape == (frames.shape[0] * vocoder32.upsample,)
    assert expected.abs().max() < 1  # not clipped: a clamp would hide differences
    # Same float32 operations in the same order (measured: equal to the bit on CPU); 1e-5
    # leaves room for another kernel (SDPA backend, BLAS) summing in another order, and is
    # ~1e-4 of the signal (std 0.17), far below what a wrong layer or mask would give.
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("chunks", [[2, 8, 8, 8, 8, 6], [1, 39], [13, 13, 14]])
def test_streamed_chunks_concatenate_to_the_whole_decode(vocoder, chunks):
    # What a frame hears fades with distance (2 layers x 8-frame window, then the
    # convolutions): on the tiny model 16 frames of context leave ~1e-4 at the seams, 24
    # ~5e-7, 28 ~1e-7 (the floor: RoPE's cos/sin are float32, as the reference's, and the
    # positions of a frame differ between chunk and whole decode).
    frames, left_context = codes(40, seed=1), 28
    (whole,) = vocoder.generate([GenerationItem(frames)])
    pieces, start = [], 0
    for size in chunks:
        context = min(start, left_context)
        item = GenerationItem(frames[start - context : start + size], context_len=context)
        (piece,) = vocoder.generate([item])
        assert piece.shape == (size * vocoder.upsample,)
        pieces.append(piece)
        start += size
    streamed = torch.cat(pieces)
    assert streamed.shape == whole.shape
    torch.testing.assert_close(streamed, whole, rtol=0, atol=1e-6)


@pytest.mark.parametrize("chunks", [[4, 16, 16, 4], [1, 1, 1, 37], [13, 27], [40]])
@pytest.mark.parametrize("prefix", [0, 5])
def test_a_stream_decodes_each_chunk_once_and_adds_up_to_the_whole(vocoder, chunks, prefix):
    # Through the stream's kept state, not re-decoded context: equal to the whole decode up
    # to float64 rounding, however the chunks are cut (with no left context at all).
    frames = codes(prefix + 40, seed=2)
    (whole,) = vocoder.generate([GenerationItem(frames, context_len=prefix)])
    items = stream_items(frames, chunks, prefix=prefix, left_context=0)
    pieces = [vocoder.generate([item])[0] for item in items]
    assert [p.shape[0] for p in pieces] == [c * vocoder.upsample for c in chunks]
    torch.testing.assert_close(torch.cat(pieces), whole, rtol=0, atol=1e-12)
    # Later chunks' left-context rows are not decoded again: other (valid) codes there
    # change nothing.
    items = stream_items(frames, chunks, prefix=prefix, left_context=8)
    for item in items[1:]:
        item.rows[: item.context_len] = (item.rows[: item.context_len] + 1) % TINY_CODEBOOK_SIZE
    again = [vocoder.generate([item])[0] for item in items]
    assert all(torch.equal(a, b) for a, b in zip(again, pieces, strict=True))


def test_after_the_end_frame_a_stream_speaks_no_more(vocoder):
    # Its later chunks (no end frame in their rows: no left context) are not speech, and
    # are not checked either: placeholders there fail nothing (the stage checks each
    # chunk as it arrives, in order, then decodes).
    speech, after = codes(21, seed=8), torch.full((14, TINY_NUM_QUANTIZERS), -1)
    end = torch.full((1, TINY_NUM_QUANTIZERS), 0)
    end[0, 0] = TINY_CODEBOOK_SIZE + 3
    (whole,) = vocoder.generate([GenerationItem(speech)])
    frames = torch.cat([speech, end, after])
    items = stream_items(frames, [4, 18, 10, 4])
    for item in items:
        vocoder.check_item(item)
    pieces = [vocoder.generate([i])[0] for i in items]
    assert pieces[2].numel() == 0 and pieces[3].numel() == 0
    torch.testing.assert_close(torch.cat(pieces), whole, rtol=0, atol=1e-12)
    # Without the end frame seen first, a placeholder is named.
    with pytest.raises(ValueError, match="placeholder"):
        vocoder.check_item(stream_items(frames, [4, 18, 10, 4])[2])


def test_two_chunks_of_a_stream_in_one_call_decode_in_order(vocoder):
    frames = codes(30, seed=5)
    other = stream_items(codes(30, seed=6), [6, 24], left_context=8)
    assert_two_chunks_in_one_call_decode_in_order(
        vocoder, lambda: stream_items(frames, [6, 12, 12], left_context=8), other
    )


def test_a_failed_call_leaves_the_stream_as_it_was(vocoder, monkeypatch):
    # The second chunk decoded, then the third failed.
    frames = codes(24, seed=7)
    assert_a_failed_call_leaves_the_stream(
        vocoder,
        monkeypatch,
        vocoder,
        "_decode",
        lambda: stream_items(frames, [8, 8, 8], left_context=8),
        after_running=False,
    )


def test_right_context_rows_are_not_decoded(vocoder):
    frames = codes(30, seed=3)
    (plain,) = vocoder.generate([GenerationItem(frames[:24], context_len=8)])
    (ahead,) = vocoder.generate([GenerationItem(frames, context_len=8, lookahead_len=6)])
    assert torch.equal(plain, ahead)


def test_the_decode_is_cut_at_the_end_frame(vocoder):
    frames = codes(12, seed=4)
    end = torch.full((1, TINY_NUM_QUANTIZERS), 0)
    end[0, 0] = TINY_CODEBOOK_SIZE + 3  # e.g. the talker's codec_eos, past the codebook
    (plain,) = vocoder.generate([GenerationItem(frames)])
    (ended,) = vocoder.generate([GenerationItem(torch.cat([frames, end]))])
    assert torch.equal(plain, ended)
    # Frames after the end frame are not speech either: cut, not filtered.
    (after,) = vocoder.generate([GenerationItem(torch.cat([frames, end, codes(5, seed=6)]))])
    assert torch.equal(plain, after)
    # A chunk of nothing but the end frame, after context: no samples.
    (last,) = vocoder.generate([GenerationItem(torch.cat([frames[-4:], end]), context_len=4)])
    assert last.numel() == 0


def test_with_the_talker_s_end_code_known_a_control_code_in_speech_is_refused(tmp_path):
    write_tiny_speech_tokenizer(tmp_path, seed=0, dtype=torch.float64)
    eos = TINY_CODEBOOK_SIZE + 3
    config = SimpleNamespace(talker_config=SimpleNamespace(codec_eos_token_id=eos))
    vocoder = Qwen3TTSCode2Wav.from_checkpoint(tmp_path, config, torch.float64)
    frames = codes(8, seed=7)
    end = torch.zeros(1, TINY_NUM_QUANTIZERS, dtype=torch.long)
    end[0, 0] = eos
    (plain,) = vocoder.generate([GenerationItem(frames)])
    (ended,) = vocoder.generate([GenerationItem(torch.cat([frames, end, frames]))])
    assert torch.equal(plain, ended)
    control = frames.clone()
    control[5, 0] = eos + 1  # another control code, not the end: not speech, not dropped
    item = GenerationItem(control, offset=40)
    message = r"codes\.audio: frame 45, codebook 0 \(the talker's code\): code 68 is outside"
    with pytest.raises(ValueError, match=message):
        vocoder.check_item(item)


def test_bad_codes_are_named(vocoder):
    frames = codes(6, seed=5)
    frames[2, 3] = -1
    message = (
        r"codes\.audio: frame 2, codebook 3 \(a code predictor's code\): code -1 is outside "
        r"the codebook 0\.\.63 \(a placeholder\?\)"
    )
    with pytest.raises(ValueError, match=message):
        vocoder.generate([GenerationItem(frames)])
    with pytest.raises(ValueError, match=message):
        vocoder.check_item(GenerationItem(frames))
    with pytest.raises(ValueError, match=r"codes\.audio: expected \[frames, 16\] codes"):
        vocoder.generate([GenerationItem(torch.zeros(5, 3, dtype=torch.long))])
    frames[2, 3] = TINY_CODEBOOK_SIZE  # past the codebook, in a speech frame
    with pytest.raises(ValueError, match=r"frame 2, codebook 3 .*: code 64 is outside"):
        vocoder.generate([GenerationItem(frames)])


def test_missing_speech_tokenizer_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"speech_tokenizer/config\.json is missing"):
        Qwen3TTSCode2Wav.from_checkpoint(tmp_path, None, torch.float32)


def test_missing_or_mismatched_weights_are_named(tmp_path):
    folder = write_tiny_speech_tokenizer(tmp_path)
    weights = safetensors.torch.load_file(str(folder / "model.safetensors"))
    del weights["decoder.pre_conv.conv.weight"]
    safetensors.torch.save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.safetensors: decoder weights do not match"):
        Qwen3TTSCode2Wav.from_checkpoint(tmp_path, None, torch.float32)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"speech_tokenizer/model\.safetensors is missing"):
        Qwen3TTSCode2Wav.from_checkpoint(tmp_path, None, torch.float32)


def test_inconsistent_upsample_rate_is_named(tmp_path):
    folder = write_tiny_speech_tokenizer(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["decode_upsample_rate"] = 1920
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json: decode_upsample_rate 1920"):
        Qwen3TTSCode2Wav.from_checkpoint(tmp_path, None, torch.float32)
