"""Ming-Omni's image input against the inclusionAI/Ming reference, on the tiny checkpoint in
float32.

The fixture (`tests/fixtures/ming_omni/image_reference.npz`) was written by the reference
code (`make_image_fixture.py` beside it says how, with which stand-ins) on the checkpoint
`make_tiny_ming_omni(path, seed=0)` writes; the test rebuilds it and checks both weight
shards' SHA-256 first. Three cases: one image, two images with text between them, and
an image over the tiny processor's `max_pixels` (resized by `fetch_image`, then again).

- the image processor: pixel patches equal, grids equal; the expanded prompt ids equal;
- the image rows (ViT + projector + normalize): within 1e-5 (measured 4.2e-7);
- the thinker with image rows and image routing (`MingInputEncoder.encode` ->
  `add_encoded_request`): greedy ids identical to the reference's `generate` as its
  scripts run it (`use_cache=False`), every step's logits within 1e-4 (measured 5.2e-6);
- the routing alone: the reference's `use_cache=True` run drops the image rows (see
  docs/ming_omni.md) but keeps the spans; ours with the per-token modality and no image
  rows gives its ids and logits (1e-4; measured 3.2e-6), and without the modality does
  not (so the gates are what is checked).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage import LLM, SamplingParams
from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.families.ming_omni.input_encoder import MingInputEncoder
from omnistage.families.ming_omni.thinker import IMAGE
from omnistage.families.ming_omni.tiny import make_tiny_ming_omni
from tests.models.npz_fixture import checked_checkpoint, load_npz

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ming_omni" / "image_reference.npz"
PROMPTS = [
    "<|im_start|>user\n<image>What is in the picture?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nCompare <image> and <image>, please.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\n<image>Describe it.<|im_end|>\n<|im_start|>assistant\n",
]
CASES = [0, 1, 2]


@pytest.fixture(scope="module")
def fixture():
    return load_npz(FIXTURE)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, fixture):
    return checked_checkpoint(
        make_tiny_ming_omni(tmp_path_factory.mktemp("ming-image"), seed=0), fixture
    )


@pytest.fixture(scope="module")
def encoder(ckpt):
    return MingInputEncoder.from_checkpoint(ckpt, torch.float32)


@pytest.fixture(scope="module")
def llm(ckpt):
    return LLM(str(ckpt), model_part="thinker", dtype="float32", executor_backend="inline")


def images(fixture, i: int) -> list[np.ndarray]:
    return [fixture[k] for k in sorted(fixture) if k.startswith(f"image_{i}_")]


def generate(llm, add) -> tuple[list[int], torch.Tensor]:
    """Greedy ids and every step's logits of the one request `add(engine, params)` adds."""
    runner, seen = llm.engine.core.executor.runner, []
    observer = runner.add_sample_observer(lambda event: seen.append(event.logits[0].clone()))
    add(llm.engine, SamplingParams(temperature=0, max_tokens=8))
    ids = None
    while llm.engine.has_unfinished_requests():
        for out in llm.engine.step():
            if out.finished:
                ids = out.outputs[0].token_ids
    runner.remove_sample_observer(observer)
    return ids, torch.stack(seen)


@pytest.mark.parametrize("i", CASES)
def test_processor_and_image_rows_match_the_reference(encoder, fixture, i):
    pixels, grid = encoder._pixels(images(fixture, i))
    assert torch.equal(pixels, torch.from_numpy(fixture[f"pixel_values_{i}"]))
    assert grid.tolist() == fixture[f"grid_{i}"].tolist()
    encoded = encoder.encode(PROMPTS[i], [], images(fixture, i))
    assert encoded.prompt_token_ids == fixture[f"prompt_ids_{i}"].tolist()
    rows = encoded.prompt_embeds[encoded.visual_pos_mask]
    torch.testing.assert_close(rows, torch.from_numpy(fixture[f"features_{i}"]), rtol=0, atol=1e-5)
    # ids in, the same expansion (the serving path hands rendered text; both are accepted)
    ids = encoder.tokenizer(PROMPTS[i], add_special_tokens=False).input_ids
    assert encoder.encode(ids, [], images(fixture, i)).prompt_token_ids == encoded.prompt_token_ids


@pytest.mark.parametrize("i", CASES)
def test_thinker_with_images_matches_the_reference(encoder, llm, fixture, i):
    encoded = encoder.encode(PROMPTS[i], [], images(fixture, i))
    kinds = encoded.token_modality
    patch = np.flatnonzero(fixture[f"prompt_ids_{i}"] == encoder.ids["<imagePatch>"])
    assert kinds.nonzero().flatten().tolist() == list(range(patch[0], patch[-1] + 1))
    assert set(kinds.tolist()) == {0, IMAGE}
    ids, logits = generate(llm, lambda eng, p: eng.add_encoded_request(f"img{i}", encoded, p))
    assert ids == fixture[f"ids_nocache_{i}"].tolist()
    torch.testing.assert_close(
        logits, torch.from_numpy(fixture[f"logits_nocache_{i}"]), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("i", CASES)
def test_image_routing_alone_matches_the_reference(llm, fixture, i):
    prompt = fixture[f"prompt_ids_{i}"].tolist()
    patch = np.flatnonzero(fixture[f"prompt_ids_{i}"] == 260)
    kinds = torch.zeros(len(prompt), dtype=torch.int64)
    kinds[patch[0] : patch[-1] + 1] = IMAGE
    ref = torch.from_numpy(fixture[f"logits_cache_{i}"])

    def add(modality):
        mm = None if modality is None else MultimodalDecoderInputs(token_modality=modality)
        return lambda eng, p: eng.add_tokenized_request(
            f"route{i}{mm is None}", None, prompt, p, mm_decoder_inputs=mm
        )

    ids, logits = generate(llm, add(kinds))
    assert ids == fixture[f"ids_cache_{i}"].tolist()
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
    _, text_only = generate(llm, add(None))
    assert (text_only - ref).abs().max() > 1e-2


def test_bad_image_input_is_a_value_error_naming_it(encoder, fixture):
    one = images(fixture, 0)
    with pytest.raises(ValueError, match=r"image: the prompt has 2 <image> placeholder\(s\) for 1"):
        encoder.encode(PROMPTS[1], [], one)
    with pytest.raises(ValueError, match="audio: 2 clips"):
        encoder.encode(PROMPTS[0], [np.zeros(1600, dtype=np.float32)] * 2, one)
    with pytest.raises(ValueError, match="image 0:"):
        encoder.encode(PROMPTS[0], [], [b"not an image"])
