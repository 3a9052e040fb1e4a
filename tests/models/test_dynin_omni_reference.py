"""Dynin-Omni against its reference code on the tiny checkpoint (float32; fixture
`fixtures/dynin_omni/reference.npz`, made by `make_reference_fixture.py` there):

- the LLaDA backbone's logits equal LLaDA's `LLaDAModelLM` within 1e-5;
- greedy masked-diffusion text ids equal Dynin's `mmu_generate`, token for token;
- the MAGVITv2 decoder's output equals Show-o's within 1e-5, and its uint8 pixels are
  Show-o's post-processing exactly;
- seeded image codes and speech units equal Dynin's loops draw for draw; the speech units
  in Dynin's `t2s_gen` template (chat-wrapped text after the instruction, `<|t2s|>`, left
  `[iPAD]` padding to t2s_max_text_len + 1 and its attention mask; two prompts padded, one
  cut), with classifier-free guidance (the tiny checkpoint's `audio_cfg_scale` 2.5,
  Dynin's t2s default), which changes them; the image codes in Dynin's `t2i_gen`
  template, guided against the empty text's template (`image_guidance_scale` 3.5,
  Dynin's t2i default), which changes them too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.families.dynin_omni.magvit import code_bits, to_pixels
from omnistage.families.dynin_omni.tiny import make_tiny_dynin_omni
from omnistage.families.dynin_omni.token2image import DyninToken2Image
from omnistage.families.dynin_omni.token2text import DyninToken2Text
from omnistage.families.dynin_omni.unmask import fill_masks
from omnistage.models.generation import GenerationItem

FIXTURE = Path(__file__).parents[1] / "fixtures" / "dynin_omni" / "reference.npz"
TOL = 1e-5


@pytest.fixture(scope="module")
def reference():
    return dict(np.load(FIXTURE))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_dynin_omni(tmp_path_factory.mktemp("dynin") / "tiny", seed=0)


@pytest.fixture(scope="module")
def text_model(checkpoint):
    return DyninToken2Text.from_checkpoint(checkpoint, None, torch.float32)


def test_logits_equal_llada(reference, text_model):
    cfg = text_model.cfg
    prompt = torch.from_numpy(reference["prompt/0"])
    masks = torch.full((6,), cfg.mask_token_id, dtype=torch.long)
    with torch.inference_mode():
        logits = text_model.lm(torch.cat([prompt, masks])[None])[0]
    expected = torch.from_numpy(reference["logits"])
    assert logits.shape == expected.shape
    torch.testing.assert_close(logits, expected, rtol=0, atol=TOL)


def test_greedy_text_ids_equal_dynin_mmu_generate(reference, text_model):
    cfg = text_model.cfg
    for i in range(3):
        prompt = torch.from_numpy(reference[f"prompt/{i}"])
        assert text_model.prompt_rows(["hello", "a cat on a mat", "Why?"][i], None).tolist() == (
            prompt.tolist()
        )
        n = cfg.text_max_new_tokens
        seq = torch.cat([prompt, torch.full((n,), cfg.mask_token_id, dtype=torch.long)])
        with torch.inference_mode():
            ours = fill_masks(
                text_model.lm,
                seq,
                prompt.numel(),
                n,
                mask_id=cfg.mask_token_id,
                block_length=cfg.text_block_length,
                steps=cfg.text_steps,
            )
        assert ours.tolist() == reference[f"text/{i}"].tolist(), i
        (answer,) = text_model.generate([GenerationItem(prompt, meta={"modalities": "text"})])
        region = ours[prompt.numel() :]
        ends = (region == cfg.eos_token_id).nonzero()
        assert answer.tolist() == (region[: int(ends[0])] if ends.numel() else region).tolist()


def test_magvit_decoder_equals_show_o(reference, checkpoint):
    model = DyninToken2Image.from_checkpoint(checkpoint, None, torch.float32)
    codes = torch.from_numpy(reference["image_codes"])
    z = code_bits(codes, model.magvit.z_channels, model.magvit.grid, torch.float32)
    with torch.inference_mode():
        decoded = model.decoder(z)
    expected = torch.from_numpy(reference["image_float"])
    torch.testing.assert_close(decoded[0], expected, rtol=0, atol=TOL)
    assert np.array_equal(to_pixels(decoded).numpy(), reference["image_pixels"])
    (pixels,) = model.generate([GenerationItem(codes, meta={"detok_id": 1})])
    assert np.array_equal(pixels.numpy(), reference["image_pixels"])


@pytest.mark.parametrize("task", ["image", "audio"])
def test_sampled_image_codes_and_speech_units_equal_dynin(reference, text_model, task):
    """Seeded: Dynin's `t2i_generate` (MaskGIT) and `t2s_generate_mmu_like` draw the same
    codes from the same seed as our loops (one generator per request)."""
    key = {"image": "image_tokens", "audio": "speech_units"}[task]
    for i, seed in enumerate([0, 11, 12345]):
        prompt = torch.from_numpy(reference[f"prompt/{i}"])
        item = GenerationItem(prompt, seed=seed, meta={"modalities": task})
        (ours,) = text_model.generate([item])
        assert ours.tolist() == reference[f"{key}/{i}"].tolist(), (task, i)


def test_speech_guidance_is_what_the_fixture_checks(reference, text_model):
    import dataclasses

    prompt = torch.from_numpy(reference["prompt/0"])
    assert text_model.cfg.audio_cfg_scale == 2.5
    guided = text_model.generate([GenerationItem(prompt, seed=0, meta={"modalities": "audio"})])
    plain_cfg = dataclasses.replace(text_model.cfg, audio_cfg_scale=0.0)
    original, text_model.cfg = text_model.cfg, plain_cfg
    try:
        plain = text_model.generate([GenerationItem(prompt, seed=0, meta={"modalities": "audio"})])
    finally:
        text_model.cfg = original
    assert guided[0].tolist() == reference["speech_units/0"].tolist()
    assert plain[0].tolist() != guided[0].tolist()


def test_speech_prompts_are_dynins_t2s_template(reference, text_model):
    padded = 0
    for i in range(3):
        ids, mask = text_model.speech_prompt(torch.from_numpy(reference[f"prompt/{i}"]))
        assert ids.tolist() == reference[f"speech_prompt/{i}"].tolist(), i
        assert (
            mask.numel() == ids.numel()
            and mask.sum() == (ids != text_model.cfg.ipad_token_id).sum()
        )
        padded += int(ids[0] == text_model.cfg.ipad_token_id)
    assert padded == 2  # "hello" and "Why?" are padded, "a cat on a mat" is cut


def test_image_prompts_are_dynins_t2i_template_and_guidance_matters(reference, text_model):
    import dataclasses

    for i in range(3):
        ids, mask, uncond, uncond_mask = text_model.image_prompts(
            torch.from_numpy(reference[f"prompt/{i}"])
        )
        assert ids.tolist() == reference[f"image_prompt/{i}"].tolist(), i
        assert ids.numel() == uncond.numel() == mask.numel() == uncond_mask.numel()
        assert uncond_mask.sum() < mask.sum()  # the empty text is padded more
        padded = int(ids[0] == text_model.cfg.ipad_token_id)
        assert padded == (i != 1), i  # "a cat on a mat" is cut
    prompt = torch.from_numpy(reference["prompt/0"])
    item = GenerationItem(prompt, seed=0, meta={"modalities": "image"})
    assert text_model.generate([item])[0].tolist() == reference["image_tokens/0"].tolist()
    original = text_model.cfg
    text_model.cfg = dataclasses.replace(original, image_guidance_scale=0.0)
    try:
        plain = text_model.generate([GenerationItem(prompt, seed=0, meta={"modalities": "image"})])
    finally:
        text_model.cfg = original
    assert plain[0].tolist() != reference["image_tokens/0"].tolist()
