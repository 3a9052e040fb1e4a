"""Qwen2.5-Omni's token2wav (DiT + BigVGAN) as a generation-stage model: for the same codes,
speaker and seeded noise, the waveform transformers' `token2wav(...)` (and its whole
`generate`) writes; 480 samples per code; per-request seeds that make a request's
waveform independent of its batch."""

from __future__ import annotations

import pytest
import torch

from omnistage.models.generation import load_generation_model
from omnistage.models.qwen25_omni_token2wav import DEFAULT_SEED
from omnistage.testing.tiny_qwen25_omni import (
    CODEBOOK_SIZE,
    DIT_NUM_EMBEDS,
    IM_END_ID,
    SAMPLE_RATE,
    SAMPLES_PER_CODE,
    TALKER_EOS_IDS,
    make_tiny_qwen25_omni,
)


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


@pytest.mark.parametrize("speaker", ["Chelsie", "Ethan"])
def test_waveform_matches_transformers_token2wav(model, vocoder, speaker):
    frames = codes(30)
    (ours,) = vocoder.generate([frames], [0], seeds=[7], speakers=[speaker])
    spk = model.speaker_map[speaker]
    assert model.token2wav.dtype == torch.float32  # transformers keeps this part in float32
    torch.manual_seed(7)  # transformers draws the DiT's starting noise from the global RNG
    with torch.no_grad():
        expected = model.token2wav(
            frames[None], conditioning=spk["cond"].float(), reference_mel=spk["ref_mel"].float()
        )
    assert ours.shape == expected.shape == (30 * SAMPLES_PER_CODE,)
    assert ours.dtype == torch.float32 and vocoder.sample_rate == SAMPLE_RATE
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)
    assert ours.abs().max() <= 1.0 and (ours.abs() < 1.0).float().mean() > 0.9
    assert ours.std() > 1e-2


def test_transformers_generate_audio_is_our_decode_of_its_codes(model, ckpt, vocoder):
    """Greedy thinker and talker draw nothing from the RNG, so `manual_seed(s)` before
    `generate` fixes token2wav's noise: its audio is `decode(its codes, seed=s)`."""
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
        return token2wav(code, **kwargs)

    model.token2wav.forward = recording
    try:
        torch.manual_seed(3)
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
    (ours,) = vocoder.generate([hf_codes], [0], seeds=[3])
    torch.testing.assert_close(ours, wav, rtol=0, atol=1e-6)


def test_samples_per_code(vocoder):
    assert vocoder.samples_per_code == SAMPLES_PER_CODE == 2 * (5 * 3 * 2 * 2 * 2 * 2)
    for n in (1, 2, 7, 13):
        assert vocoder.decode(codes(n, seed=n)).shape == (n * SAMPLES_PER_CODE,)


def test_a_seeded_request_is_the_same_alone_and_in_a_batch(vocoder):
    a, b, c = codes(9, seed=1), codes(14, seed=2), codes(9, seed=3)
    batch = vocoder.generate([a, b, c, a], [0] * 4, seeds=[5, 6, 7, 8])
    alone = [vocoder.generate([x], [0], seeds=[s])[0] for x, s in [(a, 5), (b, 6), (c, 7)]]
    for got, want in zip(batch, alone, strict=False):
        assert torch.equal(got, want)
    assert not torch.allclose(batch[0], batch[3], atol=1e-3)  # another seed, other noise
    (unseeded,) = vocoder.generate([a], [0])
    assert torch.equal(unseeded, vocoder.decode(a, seed=DEFAULT_SEED))


def test_end_codes_are_dropped_and_unknown_codes_refused(vocoder):
    frames = codes(6)
    (plain,) = vocoder.generate([frames], [0], seeds=[1])
    for end in TALKER_EOS_IDS:
        tail = torch.tensor([end, 3, end + 50])
        (cut,) = vocoder.generate([torch.cat([frames, tail])[:, None]], [0], seeds=[1])
        assert torch.equal(cut, plain)
    (empty,) = vocoder.generate([torch.tensor([TALKER_EOS_IDS[1]])], [0])
    assert empty.shape == (0,)
    with pytest.raises(ValueError, match=r"codes.audio: code \d+ is outside .*\(0\.\.65\)"):
        vocoder.generate([torch.tensor([1, DIT_NUM_EMBEDS + 1])], [0])
    with pytest.raises(ValueError, match=r"codes.audio: expected \[codes\] \(one codebook\)"):
        vocoder.generate([torch.zeros(4, 2, dtype=torch.long)], [0])
    with pytest.raises(ValueError, match="speaker: 'Nobody' is not one of Chelsie, Ethan"):
        vocoder.generate([frames], [0], speakers=["Nobody"])


def test_a_chunk_returns_only_the_samples_of_its_new_codes(vocoder):
    frames = codes(12, seed=4)
    (piece,) = vocoder.generate([frames], [5], seeds=[2])
    assert piece.shape == (7 * SAMPLES_PER_CODE,)
    assert torch.equal(piece, vocoder.decode(frames, seed=2)[5 * SAMPLES_PER_CODE :])
