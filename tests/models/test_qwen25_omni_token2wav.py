"""Qwen2.5-Omni's token2wav (DiT + BigVGAN) as a generation-stage model: for the same codes,
speaker and noise, the waveform transformers' `token2wav(...)` (and its whole `generate`)
writes; 480 samples per code; per-request seeds that make a request's waveform independent
of its batch; noise per (seed, mel frame), so stream chunks decoded with context around them
add up to the whole decode (to the measured seam differences)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from omnistage.families.qwen25_omni.tiny import make_tiny_qwen25_omni
from omnistage.families.qwen25_omni.tiny_config import (
    CODEBOOK_SIZE,
    DIT_NUM_EMBEDS,
    SAMPLE_RATE,
    SAMPLES_PER_CODE,
    TALKER_EOS_IDS,
)
from omnistage.families.qwen25_omni.tiny_processor import IM_END_ID
from omnistage.families.qwen25_omni.token2wav import DEFAULT_SEED, bigvgan_context
from omnistage.models.generation import GenerationItem, load_generation_model


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The DiT runs ~40 tiny forwards per decode: thread hand-offs would dominate."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_qwen25_omni(tmp_path_factory.mktemp("qwen25-omni-t2w"), dtype=torch.float64)


@pytest.fixture(scope="module")
def model(ckpt):
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float64).eval()


@pytest.fixture(scope="module")
def vocoder(ckpt):
    return load_generation_model(ckpt, torch.float32, part="token2wav")


def codes(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, CODEBOOK_SIZE, (n,), generator=torch.Generator().manual_seed(seed))


def with_noise(noise: torch.Tensor):
    """transformers' DiT draws its starting noise with one `torch.randn`: hand it ours."""
    return mock.patch("torch.randn", lambda *args, **kwargs: noise.clone())


@pytest.mark.parametrize("speaker", ["Chelsie", "Ethan"])
def test_waveform_matches_transformers_token2wav(model, vocoder, speaker):
    frames = codes(30)
    (ours,) = vocoder.generate([GenerationItem(frames, seed=7, speaker=speaker)])
    spk = model.speaker_map[speaker]
    assert model.token2wav.dtype == torch.float32  # transformers keeps this part in float32
    with with_noise(vocoder.noise(7, 0, 60)), torch.no_grad():
        expected = model.token2wav(
            frames[None], conditioning=spk["cond"].float(), reference_mel=spk["ref_mel"].float()
        )
    assert ours.shape == expected.shape == (30 * SAMPLES_PER_CODE,)
    assert ours.dtype == torch.float32 and vocoder.sample_rate == SAMPLE_RATE
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)
    assert ours.abs().max() <= 1.0 and (ours.abs() < 1.0).float().mean() > 0.9
    assert ours.std() > 1e-2


def test_transformers_generate_audio_is_our_decode_of_its_codes(model, ckpt, vocoder):
    """Greedy thinker and talker draw no noise: given our noise for seed 3, transformers'
    `generate` writes `decode(its codes, seed=3)`."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    inputs = tok.apply_chat_template(
        [{"role": "user", "content": "Say something."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    talker_codes: list[torch.Tensor] = []
    token2wav = model.token2wav.forward

    def recording(code, **kwargs):
        talker_codes.append(code.clone())
        with with_noise(vocoder.noise(3, 0, code.shape[1] * 2)):
            return token2wav(code, **kwargs)

    model.token2wav.forward = recording
    try:
        _, wav = model.generate(
            **inputs,
            thinker_max_new_tokens=6,
            talker_max_new_tokens=20,
            talker_do_sample=False,
            thinker_eos_token_id=IM_END_ID,
        )
    finally:
        del model.token2wav.forward
    ((hf_codes,),) = talker_codes
    assert hf_codes.numel() == 20  # the tiny talker never ends by itself
    assert wav.shape == (20 * SAMPLES_PER_CODE,)
    (ours,) = vocoder.generate([GenerationItem(hf_codes, seed=3)])
    torch.testing.assert_close(ours, wav, rtol=0, atol=1e-6)


def test_noise_depends_only_on_the_seed_and_the_mel_frame(vocoder):
    whole = vocoder.noise(5, 0, 40)
    assert whole.shape == (1, 40, vocoder.mel_dim) and whole.dtype == torch.float32
    assert torch.equal(vocoder.noise(5, 17, 9), whole[:, 17:26])
    assert not torch.equal(vocoder.noise(6, 0, 40), whole)
    assert abs(whole.mean()) < 0.1 and abs(whole.std() - 1) < 0.1


def test_samples_per_code(vocoder):
    assert vocoder.samples_per_code == SAMPLES_PER_CODE == 2 * (5 * 3 * 2 * 2 * 2 * 2)
    for n in (1, 2, 7, 13):
        assert vocoder.decode(codes(n, seed=n)).shape == (n * SAMPLES_PER_CODE,)


def test_a_seeded_request_is_the_same_alone_and_in_a_batch(vocoder):
    a, b, c = codes(9, seed=1), codes(14, seed=2), codes(9, seed=3)
    batch = vocoder.generate(
        [GenerationItem(x, seed=s) for x, s in [(a, 5), (b, 6), (c, 7), (a, 8)]]
    )
    alone = [vocoder.generate([GenerationItem(x, seed=s)])[0] for x, s in [(a, 5), (b, 6), (c, 7)]]
    for got, want in zip(batch, alone, strict=False):
        assert torch.equal(got, want)
    assert not torch.allclose(batch[0], batch[3], atol=1e-3)  # another seed, other noise
    (unseeded,) = vocoder.generate([GenerationItem(a)])
    assert torch.equal(unseeded, vocoder.decode(a, seed=DEFAULT_SEED))


def test_end_codes_are_dropped_and_unknown_codes_refused(vocoder):
    frames = codes(6)
    (plain,) = vocoder.generate([GenerationItem(frames, seed=1)])
    for end in TALKER_EOS_IDS:
        tail = torch.tensor([end, 3, end + 50])
        (cut,) = vocoder.generate([GenerationItem(torch.cat([frames, tail])[:, None], seed=1)])
        assert torch.equal(cut, plain)
        # An end code among a chunk's right-context rows ends the context there.
        rows = torch.cat([frames, tail])
        (chunk,) = vocoder.generate([GenerationItem(rows, lookahead_len=5, seed=1)])
        assert torch.equal(chunk, vocoder.decode_window(frames, 0, 0, 4, seed=1))
    (empty,) = vocoder.generate([GenerationItem(torch.tensor([TALKER_EOS_IDS[1]]))])
    assert empty.shape == (0,)
    # A chunk after the end (the end among its left-context rows): nothing of its own.
    after = torch.cat([frames[:3], torch.tensor([TALKER_EOS_IDS[0]]), frames[:4]])
    item = GenerationItem(after, context_len=4, offset=2)
    vocoder.check_item(item)
    (nothing,) = vocoder.generate([item])
    assert nothing.shape == (0,)
    bad = GenerationItem(torch.tensor([1, DIT_NUM_EMBEDS + 1]))
    for check in (lambda: vocoder.generate([bad]), lambda: vocoder.check_item(bad)):
        with pytest.raises(ValueError, match=r"codes.audio: code \d+ is outside .*\(0\.\.65\)"):
            check()
    with pytest.raises(ValueError, match=r"codes.audio: expected \[codes\] \(one codebook\)"):
        vocoder.generate([GenerationItem(torch.zeros(4, 2, dtype=torch.long))])
    with pytest.raises(ValueError, match="speaker: 'Nobody' is not one of Chelsie, Ethan"):
        vocoder.generate([GenerationItem(frames, speaker="Nobody")])


def test_bigvgan_context_is_its_receptive_field(vocoder):
    """Mel frames further than `vocoder_context` from a frame do not touch its samples."""
    from transformers import Qwen2_5OmniConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
        Qwen2_5OmniToken2WavBigVGANModel,
    )

    bigvgan, reach, hop = vocoder.module.code2wav_bigvgan_model, vocoder.vocoder_context, 240
    assert reach == 26
    mel = torch.randn(1, vocoder.mel_dim, 90, generator=torch.Generator().manual_seed(0)) - 4
    with torch.no_grad():
        base = bigvgan(mel)
        for far in (45 - reach - 1, 45 + reach + 1):
            moved = mel.clone()
            moved[..., far] += 3.0
            assert torch.equal(bigvgan(moved)[45 * hop : 46 * hop], base[45 * hop : 46 * hop])
        moved = mel.clone()
        moved[..., 45 - 10] += 3.0  # within reach: it does
        assert not torch.equal(bigvgan(moved)[45 * hop : 46 * hop], base[45 * hop : 46 * hop])
    with torch.device("meta"):  # the real config's: 34 frames (17 codes)
        real = Qwen2_5OmniToken2WavBigVGANModel(Qwen2_5OmniConfig().token2wav_config.bigvgan_config)
    assert bigvgan_context(real) == 34


def stream(vocoder, frames, sizes, left, right, seed):
    """Decode `frames` as the generation stage streams them: items owning `sizes` codes, each
    with `left` codes before and `right` after its own; the item whose right context would
    reach the end owns the rest (the stage's last chunk flushes the held codes)."""
    pieces, start, n = [], 0, frames.numel()
    for size in sizes:
        end = start + size if start + size + right < n else n  # the last chunk flushes
        context = min(start, left)
        ahead = min(right, n - end)
        item = GenerationItem(
            frames[start - context : end + ahead],
            context_len=context,
            lookahead_len=ahead,
            offset=start - context,
            seed=seed,
        )
        (piece,) = vocoder.generate([item])
        assert piece.shape == ((end - start) * SAMPLES_PER_CODE,)  # exactly its own codes'
        pieces.append(piece)
        start = end
        if start == n:
            break
    assert start == n
    return torch.cat(pieces)


@pytest.mark.parametrize(
    ("left", "right", "atol"),
    [(24, 24, 5e-5), (16, 16, 2e-4), (8, 4, None)],  # tiny blocks are 4 codes
)
def test_streamed_chunks_add_up_to_the_whole_decode(vocoder, left, right, atol):
    """float32: 24/24 codes of context leave ~1e-5 at the seams (the float32 floor), 16/16
    ~3e-5; 8/4 (one DiT pass' reach) visibly differs (see the module docstring)."""
    frames = codes(48, seed=5)
    whole = vocoder.decode(frames, seed=4)
    streamed = stream(vocoder, frames, [4] + [8] * 10, left, right, seed=4)
    assert streamed.shape == whole.shape == (48 * SAMPLES_PER_CODE,)
    if atol is None:
        assert not torch.allclose(streamed, whole, atol=1e-2)
    else:
        torch.testing.assert_close(streamed, whole, rtol=0, atol=atol)
