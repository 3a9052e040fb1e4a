"""Qwen3-Omni's code2wav as a generation-stage model: parity with transformers, and
streamed chunks (with enough left context) that add up to the whole decode: no
samples lost at the seams, and values equal to 1e-5.

The talker's end frame (first code `codec_eos`): the audio is that of exactly the frames
before it, whatever follows it, whole or streamed with the end mid-chunk; a code outside
its codebook before the end (a residual one, a `-1` placeholder) is refused naming the
frame and codebook, and in a stage it fails that request alone, naming the stage."""

from __future__ import annotations

import pytest
import torch

from omnistage.core.edge_processor import CODES_KEY
from omnistage.core.tensor_blob import blob_to_tensor
from omnistage.families.qwen3_omni.tiny import make_tiny_qwen3_omni
from omnistage.families.qwen3_omni.tiny_config import CODEBOOK_SIZE, CODEC_IDS, NUM_CODE_GROUPS
from omnistage.models.generation import GenerationItem, load_generation_model
from omnistage.pipeline.connectors.base import payload_key
from omnistage.pipeline.messages import DeliverPayload, RequestFailed, StageOutput, SubmitRequest
from omnistage.pipeline.stage_process import make_stage_core
from omnistage.testing.tiny_deploys import tiny_qwen3_omni_deploy


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_qwen3_omni(tmp_path_factory.mktemp("qwen3-omni-c2w"), dtype=torch.float64)


@pytest.fixture(scope="module")
def vocoder(ckpt):
    return load_generation_model(ckpt, torch.float64, part="code2wav")


EOS = CODEC_IDS["codec_eos_token_id"]


def codes(frames: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CODEBOOK_SIZE, (frames, NUM_CODE_GROUPS), generator=g)


def ended(speech: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
    """`speech`, then the talker's end frame (`codec_eos`, then in-range residual codes
    as the code predictor writes them), then `tail`."""
    end = codes(1, seed=99)
    end[0, 0] = EOS
    return torch.cat([speech, end, tail])


def test_whole_decode_matches_transformers(ckpt, vocoder):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    ref = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float64, experts_implementation="eager"
    )
    frames = codes(40)
    (ours,) = vocoder.generate([GenerationItem(frames)])
    with torch.no_grad():
        expected = ref.code2wav(frames.T.unsqueeze(0))[0, 0].float()
    assert ours.shape == expected.shape == (40 * vocoder.upsample - vocoder.trim,)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("chunks", [[2, 8, 8, 8, 8, 6], [1, 39], [13, 13, 14]])
def test_streamed_chunks_concatenate_to_the_whole_decode(vocoder, chunks):
    # What a frame hears fades with distance (attention window, then the convolutions):
    # on the tiny model 24 frames of context leave ~1e-3 at the seams, 32 frames ~4e-7.
    frames, left_context = codes(40, seed=1), 32
    (whole,) = vocoder.generate([GenerationItem(frames)])
    pieces, start = [], 0
    for size in chunks:
        context = min(start, left_context)
        item = GenerationItem(frames[start - context : start + size], context_len=context)
        (piece,) = vocoder.generate([item])
        pieces.append(piece)
        start += size
    streamed = torch.cat(pieces)
    assert streamed.shape == whole.shape
    torch.testing.assert_close(streamed, whole, rtol=0, atol=1e-5)


def test_short_left_context_leaves_seams(vocoder):
    """Less context than the receptive field: the chunks after the first differ a little
    (what the reference's 25-frame `chunked_decode` does with a 72-frame window)."""
    frames = codes(40, seed=2)
    (whole,) = vocoder.generate([GenerationItem(frames)])
    (first,) = vocoder.generate([GenerationItem(frames[:20])])
    (second,) = vocoder.generate([GenerationItem(frames[19:], context_len=1)])
    assert torch.equal(first, whole[: first.numel()])
    assert not torch.allclose(torch.cat([first, second]), whole, atol=1e-6)


def test_wrong_code_shape_is_named(vocoder):
    with pytest.raises(ValueError, match=r"codes.audio: expected \[frames, 4\] codes"):
        vocoder.generate([GenerationItem(torch.zeros(5, 3, dtype=torch.long))])


def test_right_context_rows_are_not_decoded(vocoder):
    """A causal decoder needs no look-ahead: rows after the chunk's own (right context, which
    the generation stage sends when the edge asks for it) change nothing."""
    frames = codes(30, seed=3)
    (plain,) = vocoder.generate([GenerationItem(frames[:24], context_len=8)])
    (ahead,) = vocoder.generate([GenerationItem(frames, context_len=8, lookahead_len=6)])
    assert torch.equal(plain, ahead)


def test_audio_is_that_of_the_frames_before_the_end_frame(vocoder):
    """Whatever follows the end frame (more speech-like frames, codes out of every range,
    right context) is not decoded: the audio is bit-identical to that of the frames before."""
    speech = codes(13, seed=4)
    (expected,) = vocoder.generate([GenerationItem(speech)])
    assert expected.numel() == 13 * vocoder.upsample - vocoder.trim
    garbage = torch.tensor([[EOS + 1, -1, CODEBOOK_SIZE, 5], [-1, 2 * CODEBOOK_SIZE, 0, -7]])
    for tail in [codes(0), codes(6, seed=5), codes(9, seed=6), garbage]:
        (ours,) = vocoder.generate([GenerationItem(ended(speech, tail))])
        assert torch.equal(ours, expected)
    # Rows held as right context after the end frame are not decoded either.
    item = GenerationItem(ended(speech, codes(6, seed=5)), lookahead_len=3)
    assert torch.equal(vocoder.generate([item])[0], expected)


@pytest.mark.parametrize(("end", "silent_chunks"), [(30, 1), (26, 2)], ids=["mid", "start"])
def test_streamed_equals_whole_when_the_end_frame_lands_in_a_chunk(vocoder, end, silent_chunks):
    """Chunks [2, 8, 8, 8, 8, 6] with 32 frames of left context: the end frame at 30 is
    mid-chunk, at 26 a chunk's first row; the chunks after it see it as context."""
    speech, left_context = codes(end, seed=7), 32
    frames = ended(speech, codes(39 - end, seed=8))
    (whole,) = vocoder.generate([GenerationItem(speech)])
    pieces, start = [], 0
    for size in [2, 8, 8, 8, 8, 6]:
        context = min(start, left_context)
        item = GenerationItem(frames[start - context : start + size], context_len=context)
        (piece,) = vocoder.generate([item])
        pieces.append(piece)
        start += size
    # The chunks from the end frame's own on (when it is their first row) have no audio.
    silent = [p.numel() == 0 for p in pieces]
    assert silent == [False] * (6 - silent_chunks) + [True] * silent_chunks
    streamed = torch.cat(pieces)
    assert streamed.shape == whole.shape
    torch.testing.assert_close(streamed, whole, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("book", "code"),
    [(0, CODEBOOK_SIZE), (0, -1), (1, -1), (2, CODEBOOK_SIZE), (3, CODEBOOK_SIZE + 7)],
)
def test_a_code_outside_its_codebook_is_refused(vocoder, book, code):
    """Any codebook, first or residual: its code would read a neighbouring codebook's
    embedding row (or run off the table), so it is an error naming frame and codebook."""
    frames = codes(12, seed=9)
    frames[5, book] = code
    match = rf"codes.audio: frame 25, codebook {book} \(.*\): code {code} is outside"
    item = GenerationItem(frames[2:], context_len=4, offset=22)
    with pytest.raises(ValueError, match=match):
        vocoder.check_item(item)
    with pytest.raises(ValueError, match=match):
        vocoder.generate([item])
    with pytest.raises(ValueError, match=r"frame 25, codebook .*outside"):
        vocoder.generate([GenerationItem(ended(frames, codes(2)), offset=20)])


def test_in_a_stage_a_bad_code_fails_its_request_alone(ckpt):
    """The stage checks each chunk as it arrives: a `-1` placeholder in a residual code
    fails that request with the stage's failure naming the codebook; another request goes
    on to its audio, and the stage holds nothing of the failed one."""
    deploy = tiny_qwen3_omni_deploy(ckpt)
    core = make_stage_core(deploy.stage("code2wav"), deploy, "tc2wbad")
    edge = "talker->code2wav"
    ((connector, _),) = [(e.connector, e) for e, _ in core.incoming.values()]

    def deliver(rid: str, index: int, rows: torch.Tensor, last: bool) -> list:
        handle = core.connectors[connector].put(payload_key(rid, edge, index), {CODES_KEY: rows})
        msg = DeliverPayload(request_id=rid, edge=edge, handle=handle, chunk_index=index, last=last)
        return core.handle(msg)

    try:
        good, bad = codes(10, seed=10), codes(10, seed=11)
        bad[6, 2] = -1
        for rid in ("good", "bad"):
            assert core.handle(SubmitRequest(request_id=rid, wait_for=[edge])) == []
            assert deliver(rid, 0, (good if rid == "good" else bad)[:4], last=False) == []
        (failed,) = deliver("bad", 1, bad[4:], last=True)
        assert isinstance(failed, RequestFailed) and failed.request_id == "bad"
        assert failed.stage == "code2wav"
        assert "frame 6, codebook 2" in failed.message and "code -1" in failed.message
        assert deliver("good", 1, ended(good[4:], codes(0)), last=True) == []
        outputs = []
        while core.has_work():
            outputs += core.step()
        assert all(isinstance(o, StageOutput) and o.request_id == "good" for o in outputs)
        assert [o.finished for o in outputs] == [False, True]
        audio = torch.cat([blob_to_tensor(o.data) for o in outputs])
        (whole,) = core.model.generate([GenerationItem(good)])
        torch.testing.assert_close(audio, whole, rtol=0, atol=1e-5)
        assert all(v == 0 for v in core.counters().values()), core.counters()
    finally:
        core.shutdown()
