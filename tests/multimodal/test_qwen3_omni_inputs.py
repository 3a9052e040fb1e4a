"""Audio and image input for the Qwen3-Omni thinker against transformers 5.23.

On the float64 tiny checkpoint (`omnistage.families.qwen3_omni.tiny`):

- the expanded prompt ids equal what `Qwen3OmniMoeProcessor` produces (and the audio
  token counts what `_get_feat_extract_output_lengths` gives for the mel frames);
- the prompt embeddings equal the thinker's `inputs_embeds` after its `masked_scatter`
  of the audio-tower / vision-encoder features, the deepstack features and the visual
  mask equal the thinker's, and the 3-D positions and rope delta equal `get_rope_index`;
- for an audio prompt, our engine (the thinker part on our own decoder) given the prompt
  embeddings produces the transformers thinker's logits and greedy tokens;
- for an image prompt, transformers' text decoder fed *our* embeddings, positions and
  deepstack features gives the thinker's logits: nothing else is needed from the input
  side to run images on our decoder once it does mrope and deepstack.

`AutoProcessor` cannot be built here (its video processor needs torchvision); the
reference processor is `Qwen3OmniMoeProcessor` built from its other parts, without
the class check that looks the video processor up.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import soundfile
import torch
from transformers import (
    AutoTokenizer,
    Qwen3OmniMoeForConditionalGeneration,
    WhisperFeatureExtractor,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
    Qwen3OmniMoeProcessor,
    _get_feat_extract_output_lengths,
)

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.engine.llm_engine import LLMEngine
from omnistage.families.qwen3_omni.input_encoder import Qwen3OmniInputEncoder
from omnistage.families.qwen3_omni.tiny import make_tiny_qwen3_omni
from omnistage.families.qwen3_omni.tiny_processor import IM_END_ID
from omnistage.multimodal import (
    check_input_modalities,
    mrope_positions,
    supported_input_modalities,
)
from tests.multimodal.media_helpers import RATE
from tests.multimodal.media_helpers import hf_thinker_embeds as _hf_embeds
from tests.multimodal.media_helpers import random_audio as _audio
from tests.multimodal.media_helpers import random_image as _image
from tests.multimodal.media_helpers import user_turn as _user


class _Processor(Qwen3OmniMoeProcessor):
    def check_argument_for_proper_class(self, *args):  # no video processor without torchvision
        return None


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_qwen3_omni(tmp_path_factory.mktemp("qwen3-omni-mm"), dtype=torch.float64)


@pytest.fixture(scope="module")
def encoder(ckpt):
    return Qwen3OmniInputEncoder.from_checkpoint(ckpt, torch.float64)


@pytest.fixture(scope="module")
def processor(ckpt):
    config = json.loads((ckpt / "processor_config.json").read_text())
    return _Processor(
        image_processor=Qwen2VLImageProcessorPil(**config["image_processor"]),
        video_processor=None,
        feature_extractor=WhisperFeatureExtractor(**config["feature_extractor"]),
        tokenizer=AutoTokenizer.from_pretrained(ckpt),
    )


@pytest.fixture(scope="module")
def thinker(ckpt):
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float64, experts_implementation="eager"
    )
    return model.thinker.eval()


def _first_step_logits(engine: LLMEngine, ids, embeds, max_tokens: int):
    runner = engine.core.executor.runner
    seen: list[torch.Tensor] = []
    observer = runner.add_sample_observer(lambda event: seen.append(event.logits))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    engine.add_tokenized_request("mm", None, ids, params, prompt_embeds=embeds)
    tokens = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                tokens = out.outputs[0].token_ids
    runner.remove_sample_observer(observer)
    return seen[0][0], tokens


# -- modalities --------------------------------------------------------------------------


def test_supported_modalities_come_from_the_config(ckpt, encoder, tiny_llama):
    assert supported_input_modalities(ckpt) == {"audio", "image"}
    assert encoder.modalities == {"audio", "image"}
    assert supported_input_modalities(tiny_llama) == frozenset()
    check_input_modalities(ckpt, ["audio", "image"])
    with pytest.raises(ValueError, match="audio: this model does not accept audio input"):
        check_input_modalities(tiny_llama, ["audio"])


# -- audio -------------------------------------------------------------------------------


def test_audio_prompt_matches_processor_and_thinker_embeddings(encoder, processor, thinker):
    clips = [_audio(2.37, 0), _audio(0.31, 1)]  # padded together, as the processor does
    chat = encoder.render_chat(
        _user(
            {"type": "text", "text": "Listen:"},
            {"type": "audio", "audio": clips[0], "sampling_rate": RATE},
            {"type": "text", "text": "and"},
            {"type": "audio", "audio": (clips[1], RATE)},
        )
    )
    assert chat.prompt.count("<|audio_start|><|audio_pad|><|audio_end|>") == 2
    ours = encoder.encode(chat.prompt, chat.audios)
    ref = processor(text=[chat.prompt], audio=clips, return_tensors="pt")

    assert ours.prompt_token_ids == ref["input_ids"][0].tolist()
    expected_counts = _get_feat_extract_output_lengths(
        ref["feature_attention_mask"].sum(-1), encoder.n_window
    ).tolist()
    assert ours.audio_token_counts == expected_counts == [31, 4]
    assert ours.prompt_token_ids.count(encoder.audio_token_id) == sum(expected_counts)
    assert encoder.num_audio_tokens(len(clips[0])) == 31  # alone: same count

    embeds, extra = _hf_embeds(thinker, ref)
    assert ours.prompt_embeds.dtype == torch.float64
    torch.testing.assert_close(ours.prompt_embeds, embeds, rtol=0, atol=0)
    assert torch.equal(ours.audio_mask, extra["audio_mask"])
    # Audio only: ordinary positions, no deepstack.
    length = len(ours.prompt_token_ids)
    assert torch.equal(ours.mrope_positions, torch.arange(length).expand(3, length))
    assert ours.rope_delta == 0 and not ours.uses_mrope
    assert ours.deepstack_embeds == [] and not ours.visual_pos_mask.any()
    with torch.no_grad():
        ref_pos, ref_delta = thinker.get_rope_index(
            ref["input_ids"], None, None, ref["attention_mask"]
        )
    assert torch.equal(ref_pos[:, 0].long(), ours.mrope_positions)
    assert int(ref_delta) == 0


def test_audio_prompt_logits_and_greedy_tokens_through_our_engine(
    ckpt, encoder, processor, thinker
):
    clip = _audio(1.5, 2)
    chat = encoder.render_chat(
        _user(
            {"type": "audio", "audio": clip, "sampling_rate": RATE}, {"type": "text", "text": "?"}
        )
    )
    ours = encoder.encode(chat.prompt, chat.audios)
    ref = processor(text=[chat.prompt], audio=[clip], return_tensors="pt")
    engine = LLMEngine(
        EngineConfig(model=str(ckpt), model_part="thinker", dtype="float64", async_scheduling=False)
    )
    logits, tokens = _first_step_logits(engine, ours.prompt_token_ids, ours.prompt_embeds, 8)
    with torch.no_grad():
        ref_out = thinker(**ref)
        generated = thinker.generate(
            **ref, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0
        )
    torch.testing.assert_close(logits.double(), ref_out.logits[0, -1], rtol=1e-4, atol=1e-4)
    assert tokens == generated[0, len(ours.prompt_token_ids) :].tolist()


# -- images ------------------------------------------------------------------------------


def test_image_and_audio_prompt_matches_thinker_features_and_positions(encoder, processor, thinker):
    images = [_image(70, 90, 3), _image(40, 130, 4)]
    clip = _audio(1.1, 5)
    chat = encoder.render_chat(
        _user(
            {"type": "text", "text": "Look"},
            {"type": "image", "image": images[0]},
            {"type": "audio", "audio": clip, "sampling_rate": RATE},
            {"type": "image", "image": images[1]},
            {"type": "text", "text": "now"},
        )
    )
    ours = encoder.encode(chat.prompt, chat.audios, chat.images)
    ref = processor(text=[chat.prompt], audio=[clip], images=images, return_tensors="pt")

    assert ours.prompt_token_ids == ref["input_ids"][0].tolist()
    assert torch.equal(ours.image_grid_thw, ref["image_grid_thw"])
    assert ours.image_grid_thw.tolist() == [[1, 4, 6], [1, 2, 8]]
    embeds, extra = _hf_embeds(thinker, ref)
    torch.testing.assert_close(ours.prompt_embeds, embeds, rtol=0, atol=0)
    assert torch.equal(ours.visual_pos_mask, extra["image_mask"])
    assert torch.equal(ours.audio_mask, extra["audio_mask"])
    assert len(ours.deepstack_embeds) == len(extra["deepstack"]) == 1
    for mine, theirs in zip(ours.deepstack_embeds, extra["deepstack"], strict=True):
        assert mine.shape == (int(ours.visual_pos_mask.sum()), encoder.hidden_size)
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)

    per_image, per_image_deepstack, grid = encoder.image_features(images)
    assert [f.shape[0] for f in per_image] == [6, 4]
    torch.testing.assert_close(torch.cat(per_image), embeds[ours.visual_pos_mask])
    assert len(per_image_deepstack) == 1 and torch.equal(grid, ours.image_grid_thw)

    with torch.no_grad():
        ref_pos, ref_delta = thinker.get_rope_index(
            ref["input_ids"],
            ref["image_grid_thw"],
            None,
            ref["attention_mask"],
            False,
            ref["feature_attention_mask"].sum(-1),
        )
    assert ours.uses_mrope
    assert torch.equal(ours.mrope_positions, ref_pos[:, 0].long())
    assert ours.rope_delta == int(ref_delta) < 0


def test_image_prompt_inputs_reproduce_the_thinker_logits(encoder, processor, thinker):
    """transformers' text decoder fed our embeddings, positions and deepstack features."""
    image = _image(100, 64, 6)
    chat = encoder.render_chat(
        _user({"type": "image", "image": image}, {"type": "text", "text": "describe"})
    )
    ours = encoder.encode(chat.prompt, images=chat.images)
    ref = processor(text=[chat.prompt], images=[image], return_tensors="pt")
    with torch.no_grad():
        expected = thinker(**ref).logits[0]
        hidden = thinker.model.language_model(
            inputs_embeds=ours.prompt_embeds[None],
            position_ids=ours.mrope_positions[:, None],
            visual_pos_masks=ours.visual_pos_mask[None],
            deepstack_visual_embeds=ours.deepstack_embeds,
        ).last_hidden_state
        logits = thinker.lm_head(hidden)[0]
        # Without deepstack the logits differ: the decoder must add the features.
        plain = thinker.lm_head(
            thinker.model.language_model(
                inputs_embeds=ours.prompt_embeds[None],
                position_ids=ours.mrope_positions[:, None],
            ).last_hidden_state
        )[0]
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    assert not torch.allclose(plain, expected, atol=1e-6)


def test_mrope_positions_layout():
    # text(2) + vision_start + 2x3 merged grid + vision_end + text(1)
    img = 7
    ids = [1, 2, 3] + [img] * 6 + [4, 5]
    positions, delta = mrope_positions(
        ids,
        torch.tensor([[1, 4, 6]]),
        image_token_id=img,
        spatial_merge_size=2,
        position_id_per_seconds=13,
    )
    assert positions.tolist() == [
        [0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7],
        [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7],
        [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7],
    ]
    assert delta == 8 - len(ids)


# -- chat forms and refusals -------------------------------------------------------------


def test_chat_accepts_openai_style_parts(tmp_path, encoder):
    clip = _audio(0.5, 7)
    wav = io.BytesIO()
    soundfile.write(wav, clip, RATE, format="WAV", subtype="FLOAT")
    image = _image(32, 32, 8)
    png = io.BytesIO()
    image.save(png, format="PNG")
    image_path = tmp_path / "img.png"
    image.save(image_path)
    b64 = base64.b64encode
    chat = encoder.render_chat(
        [
            {"role": "system", "content": "You are a test."},
            {
                "role": "user",
                "content": [
                    {"type": "input_audio", "input_audio": {"data": b64(wav.getvalue()).decode()}},
                    {
                        "type": "image_url",
                        "image_url": {
                            "url": "data:image/png;base64," + b64(png.getvalue()).decode()
                        },
                    },
                    {"type": "image_url", "image_url": {"url": f"file://{image_path}"}},
                    {"type": "text", "text": "hi"},
                ],
            },
        ]
    )
    assert chat.prompt.startswith("<|im_start|>system\nYou are a test.<|im_end|>\n")
    assert chat.prompt.endswith("<|im_start|>assistant\n")
    ours = encoder.encode(chat.prompt, chat.audios, chat.images)
    direct = encoder.encode(chat.prompt, [(clip, RATE)], [image, image])
    assert ours.prompt_token_ids == direct.prompt_token_ids
    torch.testing.assert_close(ours.prompt_embeds, direct.prompt_embeds, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("prompt", "n_audio", "n_image", "match"),
    [
        ("<|audio_start|><|audio_pad|><|audio_end|>", 0, 0, "1 audio placeholder"),
        ("hello", 1, 0, "0 audio placeholder"),
        ("<|vision_start|><|image_pad|><|vision_end|>" * 2, 0, 1, "2 image placeholder"),
        ("<|audio_pad|>", 1, 0, "must be exactly"),
        ("<|audio_start|>x<|audio_end|>", 0, 0, "must be exactly"),
        ("<|vision_start|><|image_pad|>", 0, 1, "must be exactly"),
        ("<|vision_start|><|video_pad|><|vision_end|>", 0, 0, "video input is not supported"),
    ],
)
def test_bad_prompts_are_refused(encoder, prompt, n_audio, n_image, match):
    with pytest.raises(ValueError, match=match):
        encoder.encode(prompt, [(_audio(0.2, 0), RATE)] * n_audio, [_image(8, 8, 0)] * n_image)


def test_bad_media_and_parts_are_refused(ckpt, encoder):
    placeholder = "<|audio_start|><|audio_pad|><|audio_end|>"
    with pytest.raises(ValueError, match="audio 0: sampling_rate: must be a positive number"):
        encoder.encode(placeholder, [(_audio(0.2, 0), 0)])
    with pytest.raises(ValueError, match="audio 0: .*too short"):
        encoder.encode(placeholder, [(np.zeros(100, np.float32), RATE)])
    with pytest.raises(ValueError, match="image 0: image: cannot decode"):
        encoder.encode("<|vision_start|><|image_pad|><|vision_end|>", images=[b"not an image"])
    with pytest.raises(ValueError, match="video input is not supported"):
        encoder.render_chat(_user({"type": "video", "video": "clip.mp4"}))
    with pytest.raises(ValueError, match="needs 'sampling_rate'"):
        encoder.render_chat(_user({"type": "audio", "audio": np.zeros(10)}))
    with pytest.raises(ValueError, match="remote"):
        encoder.render_chat(_user({"type": "image_url", "image_url": {"url": "http://x/y.png"}}))
    with pytest.raises(ValueError, match="unknown content part type"):
        encoder.render_chat(_user({"type": "hologram"}))

    audio_only = Qwen3OmniInputEncoder.from_checkpoint(ckpt, "float64", modalities=["audio"])
    assert audio_only.visual is None and audio_only.modalities == {"audio"}
    with pytest.raises(ValueError, match="image: this encoder was not loaded for image input"):
        audio_only.encode("<|vision_start|><|image_pad|><|vision_end|>", images=[_image(8, 8, 0)])
    with pytest.raises(ValueError, match="image: this model does not accept image input"):
        audio_only.render_chat(_user({"type": "image", "image": _image(8, 8, 0)}))


def test_shared_embedding_function_gives_the_same_embeddings(ckpt, encoder):
    table = encoder._embed
    shared = Qwen3OmniInputEncoder.from_checkpoint(
        ckpt, torch.float64, modalities=["audio"], embed_tokens=lambda ids: table[ids]
    )
    prompt = "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|><|im_end|>\n"
    clip = [(_audio(0.4, 9), RATE)]
    a, b = encoder.encode(prompt, clip), shared.encode(prompt, clip)
    assert a.prompt_token_ids == b.prompt_token_ids
    torch.testing.assert_close(a.prompt_embeds, b.prompt_embeds, rtol=0, atol=0)
    assert a.prompt_token_ids[-2] == IM_END_ID


def test_flat_preprocessor_config_of_hub_checkpoints(tmp_path, ckpt, encoder):
    """The Hub's Qwen3-Omni keeps both sub-processors in one flat preprocessor_config.json."""
    import shutil

    from omnistage.families.qwen3_omni.tiny_processor import (
        FEATURE_EXTRACTOR_CONFIG,
        IMAGE_PROCESSOR_CONFIG,
    )

    flat_dir = shutil.copytree(ckpt, tmp_path / "flat")
    (flat_dir / "processor_config.json").unlink()
    flat = {**FEATURE_EXTRACTOR_CONFIG, **IMAGE_PROCESSOR_CONFIG}
    del flat["size"]
    flat.update(min_pixels=32 * 32, max_pixels=256 * 32 * 32)
    (flat_dir / "preprocessor_config.json").write_text(json.dumps(flat))
    other = Qwen3OmniInputEncoder.from_checkpoint(flat_dir, torch.float64)
    prompt = (
        "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>"
        "<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n"
    )
    media = dict(audios=[(_audio(0.7, 10), RATE)], images=[_image(50, 70, 11)])
    a, b = encoder.encode(prompt, **media), other.encode(prompt, **media)
    assert a.prompt_token_ids == b.prompt_token_ids
    torch.testing.assert_close(a.prompt_embeds, b.prompt_embeds, rtol=0, atol=0)

    (flat_dir / "preprocessor_config.json").unlink()
    with pytest.raises(ValueError, match="no feature-extractor config"):
        Qwen3OmniInputEncoder.from_checkpoint(flat_dir, torch.float64)
