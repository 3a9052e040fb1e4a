"""Qwen3-Omni speech out on our engine vs transformers' `generate`, on the float64 tiny
checkpoint: the talker's prompt and per-frame text rows, the talker's codes (all 16...
here 4 codebooks) for the same thinker output, and the whole pipeline's text and audio.

transformers is made deterministic with greedy thinker and talker
(`thinker_do_sample=False, talker_do_sample=False`: argmax after the talker's
repetition penalty 1.05 and token suppression; the code predictor mirrors
`do_sample`) and `experts_implementation="eager"` (float64 MoE); see
tests/models/test_tiny_qwen3_omni.py. Our side uses temperature 0 everywhere.

One difference is by design: at `max_new_tokens`, transformers drops the last
frame's first code (the code predictor would only have run for it at the next
step); our talker samples a frame's codes with its first code, so it returns
that frame too. The comparisons cover the frames both have.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.engine.llm_engine import LLMEngine
from omnistage.families.qwen3_omni.talker_prompt import Qwen3OmniTalkerPrompter
from omnistage.families.qwen3_omni.tiny import make_tiny_qwen3_omni
from omnistage.families.qwen3_omni.tiny_config import ACCEPT_HIDDEN_LAYER, NUM_CODE_GROUPS
from omnistage.families.qwen3_omni.tiny_processor import IM_END_ID
from omnistage.pipeline.omni import Omni
from omnistage.testing.tiny_deploys import tiny_qwen3_omni_deploy

THINKER_TOKENS, TALKER_TOKENS = 8, 12
CHAT = [
    {"role": "system", "content": "You are a tiny test model."},
    {"role": "user", "content": "Say something."},
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_qwen3_omni(tmp_path_factory.mktemp("qwen3-omni-speech"), dtype=torch.float64)


@pytest.fixture(scope="module")
def hf_model(ckpt):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float64, experts_implementation="eager"
    ).eval()


def _hf_generate(model, inputs: dict, **extra) -> dict:
    """transformers' greedy generate on processed `inputs` (`extra`: more `generate`
    arguments, e.g. `speaker`), with what it handed the talker and code2wav."""
    seen: dict = {}
    thinker_generate, talker_generate = model.thinker.generate, model.talker.generate
    decode = model.code2wav.chunked_decode

    def thinker_hook(*args, **kwargs):
        seen["thinker"] = thinker_generate(*args, **kwargs)
        return seen["thinker"]

    def talker_hook(*args, **kwargs):
        seen["talker_kwargs"] = kwargs
        return talker_generate(*args, **kwargs)

    def decode_hook(codes, *args, **kwargs):
        seen["codes"] = codes
        return decode(codes, *args, **kwargs)

    model.thinker.generate, model.talker.generate = thinker_hook, talker_hook
    model.code2wav.chunked_decode = decode_hook
    try:
        with torch.no_grad():
            sequences, wav = model.generate(
                **inputs,
                thinker_max_new_tokens=THINKER_TOKENS,
                talker_max_new_tokens=TALKER_TOKENS,
                thinker_do_sample=False,
                talker_do_sample=False,
                thinker_eos_token_id=IM_END_ID,
                **extra,
            )
    finally:
        del model.thinker.generate, model.talker.generate, model.code2wav.chunked_decode
    steps = seen["thinker"].hidden_states
    embeds = torch.cat([s[0] for s in steps], dim=1)[0]
    accept = torch.cat([s[ACCEPT_HIDDEN_LAYER] for s in steps], dim=1)[0]
    prompt_len = inputs["input_ids"].shape[1]
    return {
        "prompt_ids": inputs["input_ids"][0].tolist(),
        "output_ids": sequences[0, prompt_len:].tolist(),
        "thinker_rows": torch.cat([embeds, accept], dim=-1),
        "talker_kwargs": seen["talker_kwargs"],
        "codes": seen["codes"][0].T,  # [frames, codebooks]
        "wav": wav.reshape(-1),
    }


@pytest.fixture(scope="module")
def omni(ckpt):
    """The streamed demo-omni pipeline on the checkpoint, started once for the tests that
    only send it requests (each test's requests are compared with their own reference)."""
    with Omni(tiny_qwen3_omni_deploy(ckpt), in_process=True) as pipeline:
        yield pipeline


@pytest.fixture(scope="module")
def reference(ckpt, hf_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    prompt = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    ref = _hf_generate(hf_model, {"input_ids": tok(prompt, return_tensors="pt").input_ids})
    return ref | {"prompt": prompt}


def test_talker_prompt_and_text_rows_equal_transformers(ckpt, reference):
    prompter = Qwen3OmniTalkerPrompter.from_checkpoint(ckpt, torch.float64)
    talker = prompter.build(
        reference["prompt_ids"], reference["output_ids"], reference["thinker_rows"]
    )
    # Text only: ordinary positions (transformers' cumsum), so no 3-D ones; also when the
    # thinker sends an empty grid list.
    assert talker.mm_decoder_inputs is None
    no_images = prompter.build(
        reference["prompt_ids"],
        reference["output_ids"],
        reference["thinker_rows"],
        image_grid_thw=torch.zeros(0, 3, dtype=torch.long),
    )
    assert no_images.mm_decoder_inputs is None
    kwargs = reference["talker_kwargs"]
    # Equal up to float64 rounding (the projections run on differently shaped batches).
    exact = dict(rtol=0, atol=1e-13)
    torch.testing.assert_close(talker.prompt_embeds, kwargs["inputs_embeds"][0], **exact)
    torch.testing.assert_close(talker.conditioning, kwargs["trailing_text_hidden"][0], **exact)
    torch.testing.assert_close(talker.fill, kwargs["tts_pad_embed"].reshape(-1), **exact)
    assert len(talker.prompt_token_ids) == talker.prompt_embeds.shape[0]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_talker_codes_equal_transformers_for_the_same_thinker_output(
    ckpt, reference, async_scheduling
):
    prompter = Qwen3OmniTalkerPrompter.from_checkpoint(ckpt, torch.float64)
    talker = prompter.build(
        reference["prompt_ids"], reference["output_ids"], reference["thinker_rows"]
    )
    engine = LLMEngine(
        EngineConfig(
            model=str(ckpt),
            model_part="talker",
            dtype="float64",
            async_scheduling=async_scheduling,
        )
    )
    frames: list[list[int]] = []
    engine.core_output_listener = lambda rid, out: frames.extend(
        [t, *c] for t, c in zip(out.new_token_ids, out.new_codes or [], strict=True)
    )
    params = SamplingParams(temperature=0, max_tokens=TALKER_TOKENS, repetition_penalty=1.05)
    engine.add_tokenized_request(
        "r", None, talker.prompt_token_ids, params, talker.prompt_embeds, True
    )
    engine.add_conditioning("r", talker.conditioning, True, talker.fill)
    while engine.has_unfinished_requests():
        engine.step()
    engine.shutdown()
    expected = reference["codes"]
    assert expected.shape == (TALKER_TOKENS - 1, NUM_CODE_GROUPS)
    assert len(frames) == TALKER_TOKENS
    assert torch.tensor(frames[: TALKER_TOKENS - 1]).equal(expected)
    assert len(set(map(tuple, frames))) > 3  # the codes change from frame to frame


GREEDY = {
    "thinker": SamplingParams(temperature=0, max_tokens=THINKER_TOKENS),
    "talker": SamplingParams(temperature=0, max_tokens=TALKER_TOKENS, repetition_penalty=1.05),
}


def test_pipeline_text_and_audio_equal_transformers(omni, reference):
    (out,) = omni.generate([reference["prompt"]], GREEDY)
    _check_against(out, reference)


def test_a_request_s_voice_equals_transformers_speaker_and_changes_the_audio(
    ckpt, hf_model, reference, omni
):
    """`voice` (any case) is the talker's speaker: the pipeline's audio with "AIDEN" is
    transformers' `generate(speaker="Aiden")`, and differs from the default voice's."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    ids = tok(reference["prompt"], return_tensors="pt").input_ids
    aiden = _hf_generate(hf_model, {"input_ids": ids}, speaker="Aiden")
    (out,) = omni.generate([reference["prompt"]], GREEDY, voice="AIDEN")
    (default,) = omni.generate([reference["prompt"]], GREEDY)
    _check_against(out, aiden)
    _check_against(default, reference)
    assert not torch.equal(aiden["codes"], reference["codes"])
    n = min(out.audio.size, default.audio.size)
    assert not np.allclose(out.audio[:n], default.audio[:n])


def _check_against(out, ref) -> None:
    assert out.error is None
    assert out.token_ids == ref["output_ids"]
    assert out.sample_rate == 24000
    wav = torch.from_numpy(out.audio).double()
    expected = ref["wav"].double()
    # The reference decodes one frame fewer (see the module docstring); code2wav is causal,
    # so its waveform is a prefix of ours.
    assert wav.shape[0] == expected.shape[0] + 64
    torch.testing.assert_close(wav[: expected.shape[0]], expected, rtol=0, atol=1e-6)


def test_pipeline_with_audio_input_equals_transformers(ckpt, hf_model, omni):
    """An audio question: the thinker hears it through the audio encoder, and the talker
    gets the thinker's layer output at the audio positions (hidden_projection)."""
    import json

    from transformers import AutoTokenizer, WhisperFeatureExtractor
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
        Qwen3OmniMoeProcessor,
    )

    class Processor(Qwen3OmniMoeProcessor):
        def check_argument_for_proper_class(self, *args):  # no torchvision here
            return None

    config = json.loads((ckpt / "processor_config.json").read_text())
    processor = Processor(
        image_processor=None,
        video_processor=None,
        feature_extractor=WhisperFeatureExtractor(**config["feature_extractor"]),
        tokenizer=AutoTokenizer.from_pretrained(ckpt),
    )
    clip = (0.1 * np.random.default_rng(0).standard_normal(16000)).astype(np.float32)
    messages = [
        {
            "role": "user",
            "content": [{"type": "audio", "audio": (clip, 16000)}, {"type": "text", "text": "Hi"}],
        }
    ]
    prompt = processor.tokenizer.apply_chat_template(
        [
            {
                "role": "user",
                "content": [{"type": "audio", "audio": "x"}, {"type": "text", "text": "Hi"}],
            }
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    inputs = processor(text=[prompt], audio=[clip], return_tensors="pt")
    ref = _hf_generate(hf_model, dict(inputs))
    (out,) = omni.generate([{"messages": messages}], GREEDY)
    _check_against(out, ref)


# -- an image question (image only: transformers' talker crashes on audio + image) ---------

IMAGE = np.random.default_rng(3).integers(0, 256, (64, 96, 3), dtype=np.uint8)


def _image_messages(image) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [{"type": "image", "image": image}, {"type": "text", "text": "What?"}],
        }
    ]


@pytest.fixture(scope="module")
def image_reference(ckpt, hf_model):
    """transformers' generate for an image question, with the rotary positions its talker
    decoder was given at every forward."""
    import json

    from PIL import Image
    from transformers import AutoTokenizer, WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
        Qwen3OmniMoeProcessor,
    )

    class Processor(Qwen3OmniMoeProcessor):
        def check_argument_for_proper_class(self, *args):  # no torchvision here
            return None

    config = json.loads((ckpt / "processor_config.json").read_text())
    processor = Processor(
        image_processor=Qwen2VLImageProcessorPil(**config["image_processor"]),
        video_processor=None,
        feature_extractor=WhisperFeatureExtractor(**config["feature_extractor"]),
        tokenizer=AutoTokenizer.from_pretrained(ckpt),
    )
    prompt = processor.tokenizer.apply_chat_template(
        _image_messages("x"), tokenize=False, add_generation_prompt=True
    )
    inputs = processor(text=[prompt], images=[Image.fromarray(IMAGE)], return_tensors="pt")
    positions: list[torch.Tensor] = []
    decoder = hf_model.talker.model
    forward = decoder.forward

    def forward_hook(*args, **kwargs):
        positions.append(kwargs["position_ids"].clone())
        return forward(*args, **kwargs)

    decoder.forward = forward_hook
    try:
        ref = _hf_generate(hf_model, dict(inputs))
    finally:
        del decoder.forward
    return ref | {"image_grid_thw": inputs["image_grid_thw"], "positions": positions}


def test_image_question_talker_prompt_and_positions_equal_transformers(ckpt, image_reference):
    """The talker's prompt for an image question, and its 3-D positions: the prompt's from
    `get_rope_index` over the talker's input ids, every later frame's the sequence index
    plus the rope delta, as transformers' talker decoder rotates them."""
    ref = image_reference
    prompter = Qwen3OmniTalkerPrompter.from_checkpoint(ckpt, torch.float64)
    talker = prompter.build(
        ref["prompt_ids"],
        ref["output_ids"],
        ref["thinker_rows"],
        image_grid_thw=ref["image_grid_thw"],
    )
    kwargs = ref["talker_kwargs"]
    exact = dict(rtol=0, atol=1e-13)
    torch.testing.assert_close(talker.prompt_embeds, kwargs["inputs_embeds"][0], **exact)
    torch.testing.assert_close(talker.conditioning, kwargs["trailing_text_hidden"][0], **exact)
    assert torch.equal(kwargs["image_grid_thw"], ref["image_grid_thw"])

    mm = talker.mm_decoder_inputs
    length = talker.prompt_embeds.shape[0]
    assert mm is not None and mm.deepstack_embeds is None and mm.visual_pos_mask is None
    assert mm.mrope_positions.shape == (3, length)
    # Really 3-D: the image's tokens share temporal positions, the rest shifts back.
    assert not torch.equal(mm.mrope_positions, torch.arange(length).expand(3, length))
    assert mm.rope_delta < 0
    prefill, *steps = ref["positions"]
    assert prefill.shape[-1] == length
    assert torch.equal(prefill[-3:, 0].long(), mm.mrope_positions)
    assert len(steps) == TALKER_TOKENS - 1
    for s, step in enumerate(steps):
        assert step.shape[-1] == 1
        expected = length + s + mm.rope_delta
        assert step[-3:].flatten().long().tolist() == [expected] * 3


def _talker_codes(ckpt, talker, mm_decoder_inputs, async_scheduling: bool) -> torch.Tensor:
    engine = LLMEngine(
        EngineConfig(
            model=str(ckpt), model_part="talker", dtype="float64", async_scheduling=async_scheduling
        )
    )
    frames: list[list[int]] = []
    engine.core_output_listener = lambda rid, out: frames.extend(
        [t, *c] for t, c in zip(out.new_token_ids, out.new_codes or [], strict=True)
    )
    engine.add_tokenized_request(
        "r",
        None,
        talker.prompt_token_ids,
        GREEDY["talker"],
        talker.prompt_embeds,
        True,
        mm_decoder_inputs,
    )
    engine.add_conditioning("r", talker.conditioning, True, talker.fill)
    while engine.has_unfinished_requests():
        engine.step()
    engine.shutdown()
    return torch.tensor(frames)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_image_question_talker_codes_equal_transformers(ckpt, image_reference, async_scheduling):
    ref = image_reference
    prompter = Qwen3OmniTalkerPrompter.from_checkpoint(ckpt, torch.float64)
    talker = prompter.build(
        ref["prompt_ids"],
        ref["output_ids"],
        ref["thinker_rows"],
        image_grid_thw=ref["image_grid_thw"],
    )
    expected = ref["codes"]
    assert expected.shape == (TALKER_TOKENS - 1, NUM_CODE_GROUPS)
    frames = _talker_codes(ckpt, talker, talker.mm_decoder_inputs, async_scheduling)
    assert len(frames) == TALKER_TOKENS
    assert frames[: TALKER_TOKENS - 1].equal(expected)
    if not async_scheduling:
        # The positions matter: with ordinary ones the talker speaks differently.
        plain = _talker_codes(ckpt, talker, None, async_scheduling)
        assert not plain[: TALKER_TOKENS - 1].equal(expected)


@pytest.mark.parametrize("stream", [True, False])
def test_pipeline_with_image_input_equals_transformers(ckpt, image_reference, omni, stream):
    """An image question through the pipeline: the thinker stage sends the talker the
    image grid with its rows, and the talker's 3-D positions give transformers' speech
    (streamed: the module's pipeline; whole payloads: a pipeline of its own)."""
    chat = [{"messages": _image_messages(IMAGE)}]
    if stream:
        (out,) = omni.generate(chat, GREEDY)
    else:
        with Omni(tiny_qwen3_omni_deploy(ckpt, stream=False), in_process=True) as whole:
            (out,) = whole.generate(chat, GREEDY)
    _check_against(out, image_reference)
