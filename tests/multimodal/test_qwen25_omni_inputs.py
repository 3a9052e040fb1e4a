"""Audio and image input for the Qwen2.5-Omni thinker against transformers 5.23.

On the float64 tiny checkpoint (`omnistage.families.qwen25_omni.tiny`):

- the expanded prompt ids equal what `Qwen2_5OmniProcessor` produces (audio padded to
  the extractor's `n_samples`, `((f - 1) // 2 + 1 - 2) // 2 + 1` tokens for `f` valid mel
  frames; images `t * h * w / 4` tokens);
- the prompt embeddings equal the thinker's `inputs_embeds` after its `masked_scatter`
  of the audio-tower / vision-encoder features, and the 3-D positions and rope delta
  equal `get_rope_index` (audio alone: plain positions; images: grid positions);
- our engine (the thinker part on our own decoder, non-interleaved mrope for images)
  given the encoded prompt gives the transformers thinker's logits and greedy tokens,
  for an audio prompt and for an image prompt;
- `load_input_encoder` and `supported_input_modalities` pick Qwen2.5-Omni by its
  `model_type`, and a pipeline (`Omni(model=...)`, the packaged qwen25-omni deploy)
  answers a chat with an audio part exactly as the engine does.

`AutoProcessor` cannot be built here (its video processor needs torchvision); the
reference processor is `Qwen2_5OmniProcessor` built from its other parts, without the
class check that looks the video processor up.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoTokenizer, WhisperFeatureExtractor
from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import (
    Qwen2_5OmniProcessor,
    _get_feat_extract_output_lengths,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.engine.llm_engine import LLMEngine
from omnistage.families.qwen3_omni.input_encoder import Qwen3OmniInputEncoder
from omnistage.families.qwen25_omni.input_encoder import Qwen25OmniInputEncoder
from omnistage.families.qwen25_omni.tiny import make_tiny_qwen25_omni
from omnistage.families.qwen25_omni.tiny_processor import IM_END_ID
from omnistage.multimodal import (
    check_input_modalities,
    input_encoder_class,
    load_input_encoder,
    render_model_chat,
    supported_input_modalities,
)
from tests.multimodal.media_helpers import RATE
from tests.multimodal.media_helpers import hf_thinker_embeds as _hf_embeds
from tests.multimodal.media_helpers import random_audio as _audio
from tests.multimodal.media_helpers import random_image as _image
from tests.multimodal.media_helpers import user_turn as _user

AUDIO = "<|audio_bos|><|AUDIO|><|audio_eos|>"
IMAGE = "<|vision_bos|><|IMAGE|><|vision_eos|>"


class _Processor(Qwen2_5OmniProcessor):
    def check_argument_for_proper_class(self, *args):  # no video processor without torchvision
        return None


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_qwen25_omni(tmp_path_factory.mktemp("qwen25-omni-mm"), dtype=torch.float64)


@pytest.fixture(scope="module")
def encoder(ckpt):
    return load_input_encoder(ckpt, torch.float64)


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
def hf_model(ckpt):
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float64).eval()


@pytest.fixture(scope="module")
def thinker(hf_model):
    return hf_model.thinker


@pytest.fixture(scope="module")
def engine(ckpt):
    engine = LLMEngine(
        EngineConfig(model=str(ckpt), model_part="thinker", dtype="float64", async_scheduling=False)
    )
    yield engine
    engine.shutdown()


def _hf_rope_index(thinker, ref):
    with torch.no_grad():
        audio_lengths = (
            ref["feature_attention_mask"].sum(-1) if "feature_attention_mask" in ref else None
        )
        positions, delta = thinker.get_rope_index(
            ref["input_ids"],
            ref.get("image_grid_thw"),
            None,
            ref["attention_mask"],
            False,
            audio_lengths,
        )
    return positions[:, 0].long(), int(delta)


def _engine_run(engine: LLMEngine, encoded, max_tokens: int):
    """Our thinker on an encoded prompt: the first step's logits and the greedy tokens."""
    runner = engine.core.executor.runner
    seen: list[torch.Tensor] = []
    observer = runner.add_sample_observer(lambda event: seen.append(event.logits))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    try:
        engine.add_encoded_request("mm", encoded, params)
        tokens = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    tokens = out.outputs[0].token_ids
    finally:
        runner.remove_sample_observer(observer)
    return seen[0][0], tokens


# -- which encoder, which modalities ----------------------------------------------------


def test_model_type_picks_the_encoder_and_modalities(ckpt, encoder, tiny_llama):
    assert type(encoder) is Qwen25OmniInputEncoder
    assert input_encoder_class(ckpt) is Qwen25OmniInputEncoder
    assert input_encoder_class(tiny_llama) is None
    assert supported_input_modalities(ckpt) == {"audio", "image"} == encoder.modalities
    check_input_modalities(ckpt, ["audio", "image"])
    with pytest.raises(ValueError, match="takes no audio or image input"):
        load_input_encoder(tiny_llama)
    with pytest.raises(ValueError, match="not a Qwen3-Omni checkpoint"):
        Qwen3OmniInputEncoder.from_checkpoint(ckpt)
    chat = render_model_chat(ckpt, encoder.tokenizer, _user({"type": "image", "image": "x.png"}))
    assert chat.prompt.count(IMAGE) == 1 and chat.images == ["x.png"]


# -- audio -------------------------------------------------------------------------------


def test_audio_prompt_matches_processor_thinker_embeddings_and_positions(
    encoder, processor, thinker
):
    clips = [_audio(2.37, 0), _audio(0.31, 1)]
    chat = encoder.render_chat(
        _user(
            {"type": "text", "text": "Listen:"},
            {"type": "audio", "audio": clips[0], "sampling_rate": RATE},
            {"type": "text", "text": "and"},
            {"type": "audio", "audio": (clips[1], RATE)},
        )
    )
    assert chat.prompt.count(AUDIO) == 2
    ours = encoder.encode(chat.prompt, chat.audios)
    ref = processor(text=[chat.prompt], audio=clips, return_tensors="pt")

    assert ours.prompt_token_ids == ref["input_ids"][0].tolist()
    # The processor pads every clip to the extractor's n_samples (300 s here).
    assert ref["input_features"].shape[-1] == encoder.feature_extractor.nb_max_frames
    expected = _get_feat_extract_output_lengths(ref["feature_attention_mask"].sum(-1)).tolist()
    assert ours.audio_token_counts == expected == [59, 8]
    assert [encoder.num_audio_tokens(len(c)) for c in clips] == expected
    processor_counts = processor._get_num_multimodal_tokens(audio_lengths=[len(c) for c in clips])
    assert processor_counts["num_audio_tokens"] == expected

    embeds, extra = _hf_embeds(thinker, ref)
    assert ours.prompt_embeds.dtype == torch.float64
    torch.testing.assert_close(ours.prompt_embeds, embeds, rtol=0, atol=0)
    assert torch.equal(ours.audio_mask, extra["audio_mask"])
    # Audio only: plain positions (get_rope_index has no 3-D branch without grids).
    length = len(ours.prompt_token_ids)
    assert torch.equal(ours.mrope_positions, torch.arange(length).expand(3, length))
    assert ours.rope_delta == 0 and not ours.uses_mrope and ours.deepstack_embeds == []
    positions, delta = _hf_rope_index(thinker, ref)
    assert torch.equal(positions, ours.mrope_positions) and delta == 0


@pytest.mark.parametrize(
    "lengths",
    [
        [37920, 4960, 16000],  # together, padded to the longest
        [160 * 77],  # a whole number of hops
        [160 * 77 + 1],
        [4_800_000 - 100],  # near the extractor's n_samples (300 s)
        [4_800_000 + 16_000],  # longer: truncated there, as the processor does
    ],
)
def test_mel_frames_equal_the_processor_s(encoder, processor, lengths):
    """The processor pads every clip to 300 s; we pad less (see
    `Qwen25OmniInputEncoder.feature_extractor_kwargs`) and get the same valid frames."""
    clips = [_audio(n / RATE, k) for k, n in enumerate(lengths)]
    clips.append(np.zeros(3000, np.float32))  # silence: the spectrogram's floor everywhere
    ref = processor(text=[AUDIO * len(clips)], audio=clips, return_tensors="pt")
    mask = ref["feature_attention_mask"].bool()
    features, frames = encoder.mel_features(clips)
    assert torch.equal(frames, mask.sum(-1))
    assert torch.equal(features, ref["input_features"].permute(0, 2, 1)[mask].permute(1, 0))
    counts = _get_feat_extract_output_lengths(frames).tolist()
    assert [encoder.num_audio_tokens(len(c)) for c in clips] == counts
    assert encoder.audio_token_counts(frames) == counts


def test_audio_prompt_logits_and_greedy_tokens_through_our_engine(
    encoder, processor, thinker, engine
):
    clip = _audio(1.5, 2)
    messages = _user(
        {"type": "audio", "audio": clip, "sampling_rate": RATE}, {"type": "text", "text": "?"}
    )
    ours = encoder.encode_chat(messages)
    ref = processor(text=[encoder.render_chat(messages).prompt], audio=[clip], return_tensors="pt")
    assert ours.prompt_token_ids == ref["input_ids"][0].tolist()
    logits, tokens = _engine_run(engine, ours, 8)
    with torch.no_grad():
        expected = thinker(**ref).logits[0, -1]
        generated = thinker.generate(
            **ref, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0
        )
    torch.testing.assert_close(logits.double(), expected, rtol=1e-4, atol=1e-4)
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
    # 14-pixel patches, 28-pixel merged tokens (min_pixels 3136 = 56 x 56).
    assert ours.image_grid_thw.tolist() == [[1, 4, 6], [1, 2, 10]]
    embeds, extra = _hf_embeds(thinker, ref)
    torch.testing.assert_close(ours.prompt_embeds, embeds, rtol=0, atol=0)
    assert torch.equal(ours.visual_pos_mask, extra["image_mask"])
    assert torch.equal(ours.audio_mask, extra["audio_mask"])
    assert ours.deepstack_embeds == []

    per_image, deepstack, grid = encoder.image_features(images)
    assert [f.shape[0] for f in per_image] == [6, 5] and deepstack == []
    torch.testing.assert_close(torch.cat(per_image), embeds[ours.visual_pos_mask])
    assert torch.equal(grid, ours.image_grid_thw)

    positions, delta = _hf_rope_index(thinker, ref)
    assert ours.uses_mrope
    assert torch.equal(ours.mrope_positions, positions)
    assert ours.rope_delta == delta < 0


def test_image_prompt_logits_and_greedy_tokens_through_our_engine(
    encoder, processor, thinker, engine
):
    image = _image(100, 64, 6)
    messages = _user({"type": "image", "image": image}, {"type": "text", "text": "describe"})
    ours = encoder.encode_chat(messages)
    ref = processor(
        text=[encoder.render_chat(messages).prompt], images=[image], return_tensors="pt"
    )
    assert ours.uses_mrope and ours.rope_delta < 0
    logits, tokens = _engine_run(engine, ours, 8)
    with torch.no_grad():
        expected = thinker(**ref).logits[0, -1]
        generated = thinker.generate(
            **ref, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0
        )
        # With plain 1-D positions the logits differ: the decoder must rotate in 3-D.
        plain = thinker(**ref, position_ids=torch.arange(len(ours.prompt_token_ids))[None])
    torch.testing.assert_close(logits.double(), expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(plain.logits[0, -1], expected, atol=1e-3)
    assert tokens == generated[0, len(ours.prompt_token_ids) :].tolist()


# -- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "n_audio", "n_image", "match"),
    [
        (AUDIO, 0, 0, "1 audio placeholder"),
        (IMAGE * 2, 0, 1, "2 image placeholder"),
        ("<|AUDIO|>", 1, 0, "must be exactly"),
        ("<|vision_bos|><|IMAGE|>", 0, 1, "must be exactly"),
        ("<|vision_bos|><|VIDEO|><|vision_eos|>", 0, 0, "video input is not supported"),
        # Qwen3-Omni's placeholders are plain text to this model.
        ("<|audio_start|><|audio_pad|><|audio_end|>", 1, 0, "0 audio placeholder"),
    ],
)
def test_bad_prompts_are_refused(encoder, prompt, n_audio, n_image, match):
    with pytest.raises(ValueError, match=match):
        encoder.encode(prompt, [(_audio(0.2, 0), RATE)] * n_audio, [_image(8, 8, 0)] * n_image)


def test_too_short_audio_is_refused(encoder):
    # 2 mel frames give no audio token in Qwen2.5-Omni (3 are needed).
    with pytest.raises(ValueError, match="audio 0: too short .* give no audio tokens"):
        encoder.encode(AUDIO, [(np.zeros(300, np.float32), RATE)])
    assert len(encoder.encode(AUDIO, [(np.zeros(321, np.float32), RATE)]).prompt_token_ids) == 3


# -- through the pipeline ----------------------------------------------------------------


def _chat(parts) -> list[dict]:
    return [
        {"role": "system", "content": "You are a tiny test model."},
        {"role": "user", "content": [*parts, {"type": "text", "text": "What is it?"}]},
    ]


AUDIO_CHAT = _chat([{"type": "audio", "audio": _audio(0.8, 7), "sampling_rate": RATE}])
IMAGE_CHAT = _chat([{"type": "image", "image": np.asarray(_image(60, 90, 8))}])


def test_audio_and_image_questions_get_the_engine_s_answer_through_the_pipeline(
    ckpt, encoder, engine
):
    """`Omni(model=...)` (the packaged qwen25-omni deploy): the thinker stage encodes the
    chat's media with `load_input_encoder` and answers as our engine does directly (which
    the tests above prove equals transformers), images with their 3-D positions."""
    from omnistage.pipeline.omni import Omni

    greedy = SamplingParams(temperature=0, max_tokens=6)
    # Sync scheduling: no worker processes to start (the async path is the engine's own).
    with Omni(
        model=str(ckpt), in_process=True, dtype="float64", async_scheduling=False, num_threads=1
    ) as omni:
        outs = omni.generate(
            [{"messages": AUDIO_CHAT}, {"messages": IMAGE_CHAT}], {"thinker": greedy}, ["text"]
        )
    for out, messages in zip(outs, (AUDIO_CHAT, IMAGE_CHAT), strict=True):
        assert out.error is None, out.error
        encoded = encoder.encode_chat(messages)
        engine.add_encoded_request("direct", encoded, greedy)
        done = None
        while engine.has_unfinished_requests():
            for o in engine.step():
                done = o
        assert len(out.token_ids) == 6
        assert out.token_ids == done.outputs[0].token_ids
    assert encoder.encode_chat(IMAGE_CHAT).uses_mrope


def _pipeline_talker_codes(ckpt, chat, thinker_tokens: int, talker_tokens: int):
    """Thinker -> talker through the packaged deploy (sync), the talker's codes as output."""
    import dataclasses

    from omnistage.pipeline.deploy import deploy_for_model
    from omnistage.pipeline.omni import Omni

    spec = deploy_for_model(
        str(ckpt), {"dtype": "float64", "num_threads": 1, "async_scheduling": False}
    )
    spec = dataclasses.replace(  # thinker -> talker, the talker's codes as the output
        spec,
        stages=tuple(
            dataclasses.replace(s, final_output=True, final_output_type="tokens")
            if s.name == "talker"
            else s
            for s in spec.stages
            if s.name != "token2wav"
        ),
        edges=tuple(e for e in spec.edges if e.dst != "token2wav"),
    )
    params = {
        "thinker": SamplingParams(temperature=0, max_tokens=thinker_tokens),
        "talker": SamplingParams(temperature=0, max_tokens=talker_tokens, repetition_penalty=1.05),
    }
    with Omni(spec, in_process=True) as omni:
        (out,) = omni.generate([{"messages": chat}], params)
    assert out.error is None, out.error
    return out


def test_audio_question_talker_codes_equal_transformers(ckpt, encoder, processor, hf_model):
    """Thinker -> talker through the pipeline for an audio question: the thinker's tokens and
    the talker's greedy codes are transformers' `generate` (its talker given the prefill mask
    `generate` drops, as in tests/models/test_qwen25_omni_pipeline.py). The audio positions
    are zeroed in what the talker gets, and its positions are plain for audio prompts."""
    thinker_tokens, talker_tokens = 8, 12
    out = _pipeline_talker_codes(ckpt, AUDIO_CHAT, thinker_tokens, talker_tokens)

    clip = AUDIO_CHAT[1]["content"][0]["audio"]
    ref = processor(
        text=[encoder.render_chat(AUDIO_CHAT).prompt], audio=[clip], return_tensors="pt"
    )
    codes = _hf_talker_codes(hf_model, ref, thinker_tokens, talker_tokens)
    assert out.token_ids == codes["thinker"]
    assert out.outputs["talker"].token_ids == codes["talker"]
    assert len(set(codes["talker"])) > 3


def test_image_question_talker_codes_equal_transformers(ckpt, encoder, processor, hf_model):
    """Thinker -> talker through the pipeline for an image question: the thinker sends the
    image grid (`mm.image_grid_thw`), the talker's prompt gets `get_rope_index`'s 3-D
    positions over `[prompt ids, speaker bos, out[0]]` and its decode steps index +
    rope_delta, as transformers' talker computes them whenever it is given a mask (here
    at every forward, as `generate` keeps it for a padded batch): the same thinker tokens
    and greedy talker codes. transformers takes the pixels as `thinker_pixel_values` (its
    talker would get `pixel_values` too); `image_grid_thw` goes to both."""
    thinker_tokens, talker_tokens = 8, 12
    out = _pipeline_talker_codes(ckpt, IMAGE_CHAT, thinker_tokens, talker_tokens)

    image = Image.fromarray(IMAGE_CHAT[1]["content"][0]["image"])
    ref = dict(
        processor(
            text=[encoder.render_chat(IMAGE_CHAT).prompt], images=[image], return_tensors="pt"
        )
    )
    ref["thinker_pixel_values"] = ref.pop("pixel_values")
    positions: list[torch.Tensor] = []
    codes = _hf_talker_codes(
        hf_model, ref, thinker_tokens, talker_tokens, every_step=True, positions=positions
    )
    assert out.token_ids == codes["thinker"]
    assert out.outputs["talker"].token_ids == codes["talker"]
    assert len(set(codes["talker"])) > 3

    # The reference really rotated in 3-D, and our talker input carries those positions.
    from omnistage.families.qwen25_omni.model import Qwen25TalkerSpecials, qwen25_talker_inputs

    specials = Qwen25TalkerSpecials.from_checkpoint(ckpt, torch.float64)
    prompt_ids = ref["input_ids"][0].tolist()
    rows = torch.zeros(len(prompt_ids) + thinker_tokens, specials.text_pad.shape[0]).double()
    talker = qwen25_talker_inputs(
        rows, rows, prompt_ids, codes["thinker"], specials, image_grid_thw=ref["image_grid_thw"]
    )
    mm = talker.mm_decoder_inputs
    length = len(prompt_ids) + 2
    assert mm is not None and mm.rope_delta < 0
    prefill, *steps = positions
    assert torch.equal(prefill[:, 0], mm.mrope_positions)
    assert not torch.equal(mm.mrope_positions, torch.arange(length).expand(3, length))
    for s, step in enumerate(steps):
        assert step[:, 0].flatten().tolist() == [length + s + mm.rope_delta] * 3


def test_text_and_audio_prompts_keep_plain_talker_positions(ckpt, encoder):
    """Without images the talker input has no 3-D positions (plain 1-D path), also when the
    thinker sends an empty grid list; the processor hands the grids on only when present."""
    from omnistage.core.edge_processor import IMAGE_GRID_KEY
    from omnistage.families.qwen25_omni.model import Qwen25TalkerSpecials, qwen25_talker_inputs
    from omnistage.pipeline.processors import get_processor

    specials = Qwen25TalkerSpecials.from_checkpoint(ckpt, torch.float64)
    for chat in (_chat([]), AUDIO_CHAT):
        prompt_ids = encoder.encode_chat(chat).prompt_token_ids
        output_ids = [11, 12, IM_END_ID]
        rows = torch.randn(len(prompt_ids) + 2, specials.text_pad.shape[0]).double()
        for grid in (None, torch.zeros(0, 3, dtype=torch.long)):
            talker = qwen25_talker_inputs(
                rows, rows, prompt_ids, output_ids, specials, image_grid_thw=grid
            )
            assert talker.mm_decoder_inputs is None
    processor = get_processor("qwen25_omni_thinker_to_talker")
    assert IMAGE_GRID_KEY in processor.accumulate
    processor.specials = specials
    payload = {
        "ids.prompt": torch.tensor(prompt_ids),
        "ids.output": torch.tensor(output_ids),
        "hidden_states.output": torch.cat([rows, rows], dim=1),
    }
    assert processor.to_input(payload).mm_decoder_inputs is None


def _hf_talker_codes(
    model,
    ref,
    thinker_tokens: int,
    talker_tokens: int,
    every_step: bool = False,
    positions: list | None = None,
) -> dict:
    """transformers' greedy `generate`, its talker given the all-ones mask `generate` drops:
    at the prefill (its codec rows), or with `every_step` at every forward (then it also
    computes the decode positions from its rope delta, as for a padded batch). The talker
    decoder's rotary positions go to `positions`."""
    forward = model.talker.forward

    @functools.wraps(forward)  # generate checks its kwargs against the signature
    def masked(*args, **kwargs):
        cache = kwargs.get("past_key_values")
        past = 0 if cache is None else cache.get_seq_length()
        if kwargs.get("attention_mask") is None and (every_step or past == 0):
            embeds = kwargs.get("inputs_embeds")
            new = embeds.shape[1] if embeds is not None else kwargs["input_ids"].shape[1]
            kwargs["attention_mask"] = torch.ones(1, past + new, dtype=torch.long)
        return forward(*args, **kwargs)

    rotary = model.talker.model.rotary_emb
    hook = rotary.register_forward_pre_hook(
        lambda module, args: positions.append(args[1].clone()) if positions is not None else None
    )
    codes: list[list[int]] = []
    token2wav = model.token2wav.forward
    model.talker.forward = masked
    model.token2wav.forward = lambda code, **kw: (
        codes.append(code[0].tolist()),
        token2wav(code, **kw),
    )[1]
    try:
        with torch.no_grad():
            sequences, _ = model.generate(
                **ref,
                thinker_max_new_tokens=thinker_tokens,
                talker_max_new_tokens=talker_tokens,
                talker_do_sample=False,
                thinker_eos_token_id=IM_END_ID,
            )
    finally:
        hook.remove()
        del model.talker.forward, model.token2wav.forward
    return {"thinker": sequences[0, ref["input_ids"].shape[1] :].tolist(), "talker": codes[0]}
