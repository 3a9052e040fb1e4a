"""Image prompts for the Qwen3-Omni thinker on our decoder, against transformers 5.23.

On the float64 tiny checkpoint, an image (and an image + audio) prompt encoded by
`Qwen3OmniInputEncoder` and run by our engine (3-D interleaved mrope positions for the
prompt, `i + rope_delta` after it, deepstack features added after layer 0) gives:

- the transformers thinker's logits at every generated step (prefill and decodes, so
  both the 3-D prompt positions and the shifted decode positions are right) and its
  greedy tokens (`thinker.generate`), sync and async; the 3-D positions and deepstack
  features reach a worker process's runner intact (the process executor's messages);
- the same when the prompt is prefilled in small chunks (chunk boundaries inside the
  image tokens), when it is batched with a text-only request (whose logits stay those
  of transformers), and when the KV cache is so small that requests are preempted and
  recomputed;
- the hidden states the talker receives, taken before the deepstack addition, equal to
  transformers' `hidden_states[0]` and `[accept_hidden_layer]`;
- prefix caching: an equal image prompt reuses the blocks, the same ids and embeddings
  without the 3-D positions do not.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import (
    AutoTokenizer,
    Qwen3OmniMoeForConditionalGeneration,
    WhisperFeatureExtractor,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.engine.llm_engine import LLMEngine
from omnistage.families.qwen3_omni.input_encoder import Qwen3OmniInputEncoder
from omnistage.families.qwen3_omni.tiny import make_tiny_qwen3_omni
from omnistage.families.qwen3_omni.tiny_config import ACCEPT_HIDDEN_LAYER
from omnistage.layers.rotary import mrope_frequency_rows
from omnistage.worker.sample_observer import SampleEvent, SampleObserver
from tests.multimodal.media_helpers import RATE
from tests.multimodal.media_helpers import random_audio as _audio
from tests.multimodal.media_helpers import random_image as _image

STEPS = 8
TOL = dict(rtol=1e-5, atol=1e-5)  # transformers: float32 norms and logits
TEXT_IDS = [5, 17, 33, 9, 100, 41, 7, 250, 12, 3, 88]


class _Processor(Qwen3OmniMoeProcessor):
    def check_argument_for_proper_class(self, *args):  # no video processor without torchvision
        return None


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_qwen3_omni(tmp_path_factory.mktemp("qwen3-omni-img"), dtype=torch.float64)


@pytest.fixture(scope="module")
def encoder(ckpt):
    return Qwen3OmniInputEncoder.from_checkpoint(ckpt, torch.float64)


@pytest.fixture(scope="module")
def thinker(ckpt):
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float64, experts_implementation="eager"
    )
    return model.thinker.eval()


@pytest.fixture(scope="module")
def prompts(ckpt, encoder, thinker):
    """Per prompt: our encoding, transformers' greedy tokens, per-step logits and the
    prefill's hidden states (input embeddings, output of layer `accept_hidden_layer - 1`)."""
    config = json.loads((ckpt / "processor_config.json").read_text())
    processor = _Processor(
        image_processor=Qwen2VLImageProcessorPil(**config["image_processor"]),
        video_processor=None,
        feature_extractor=WhisperFeatureExtractor(**config["feature_extractor"]),
        tokenizer=AutoTokenizer.from_pretrained(ckpt),
    )
    image, clip = _image(100, 64, 6), _audio(1.1, 5)
    images = [_image(70, 90, 3), _image(40, 130, 4)]
    cases = {
        "image": (
            [{"type": "image", "image": image}, {"type": "text", "text": "describe"}],
            dict(images=[image]),
        ),
        "image_audio": (
            [
                {"type": "text", "text": "Look"},
                {"type": "image", "image": images[0]},
                {"type": "audio", "audio": clip, "sampling_rate": RATE},
                {"type": "image", "image": images[1]},
                {"type": "text", "text": "now"},
            ],
            dict(images=images, audio=[clip]),
        ),
    }
    out = {}
    for name, (content, media) in cases.items():
        chat = encoder.render_chat([{"role": "user", "content": content}])
        ours = encoder.encode(chat.prompt, chat.audios, chat.images)
        ref = processor(text=[chat.prompt], return_tensors="pt", **media)
        assert ours.prompt_token_ids == ref["input_ids"][0].tolist()
        assert ours.uses_mrope and ours.rope_delta < 0 and len(ours.deepstack_embeds) == 1
        with torch.no_grad():
            gen = thinker.generate(
                **ref,
                max_new_tokens=STEPS,
                min_new_tokens=STEPS,
                do_sample=False,
                pad_token_id=0,
                output_logits=True,
                output_hidden_states=True,
                return_dict_in_generate=True,
            )
        length = len(ours.prompt_token_ids)
        prefill = gen.hidden_states[0]
        out[name] = dict(
            encoded=ours,
            tokens=gen.sequences[0, length:].tolist(),
            logits=torch.stack([step[0] for step in gen.logits]).double(),
            hidden=torch.cat([prefill[0][0], prefill[ACCEPT_HIDDEN_LAYER][0]], dim=-1),
        )
    return out


@pytest.fixture(scope="module")
def text_reference(thinker):
    with torch.no_grad():
        gen = thinker.generate(
            torch.tensor([TEXT_IDS]),
            max_new_tokens=STEPS,
            min_new_tokens=STEPS,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return dict(
        tokens=gen.sequences[0, len(TEXT_IDS) :].tolist(),
        logits=torch.stack([step[0] for step in gen.logits]).double(),
    )


def _engine(ckpt, **kw) -> LLMEngine:
    kw.setdefault("async_scheduling", False)
    return LLMEngine(EngineConfig(model=str(ckpt), model_part="thinker", dtype="float64", **kw))


@pytest.fixture(scope="module")
def sync_engine(ckpt):
    return _engine(ckpt, output_hidden_states=True)


def _params(logprobs: int | None = None) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=STEPS, min_tokens=STEPS, logprobs=logprobs)


def _record_logits(engine: LLMEngine) -> tuple[dict[str, list[torch.Tensor]], SampleObserver]:
    """Per request, the logits of each of its sampling steps (the sync runner's), and the
    observer that records them."""
    seen: dict[str, list[torch.Tensor]] = {}

    def observe(event: SampleEvent) -> None:
        for req_id, logits in zip(event.req_ids, event.logits, strict=True):
            seen.setdefault(req_id, []).append(logits)

    return seen, engine.core.executor.runner.add_sample_observer(observe)


def _stop_recording(engine: LLMEngine, observer: SampleObserver) -> None:
    """Remove `_record_logits`' observer and `_record_forward`'s wrapper."""
    runner = engine.core.executor.runner
    runner.remove_sample_observer(observer)
    del runner.model.forward


def _record_forward(engine: LLMEngine) -> list[tuple[int, bool]]:
    """Per forward pass of the (sync) runner's model: (positions.ndim, deepstack given)."""
    model = engine.core.executor.runner.model
    calls: list[tuple[int, bool]] = []
    original = type(model).forward

    def forward(input_ids, positions, inputs_embeds=None, **kw):
        calls.append((positions.ndim, kw.get("deepstack") is not None))
        return original(model, input_ids, positions, inputs_embeds, **kw)

    model.forward = forward
    return calls


def _run(engine: LLMEngine) -> dict[str, object]:
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


def _check_logprobs(output, logits: torch.Tensor) -> None:
    """The reported top logprobs per step are transformers' log-softmax of its logits."""
    completion = output.outputs[0]
    assert len(completion.logprobs) == logits.shape[0]
    ref = torch.log_softmax(logits, dim=-1)
    for step, entry in enumerate(completion.logprobs):
        for token_id, lp in entry.items():
            assert abs(lp.logprob - float(ref[step, token_id])) < 1e-5, (step, token_id)


def _add(engine: LLMEngine, request_id: str, case: dict, logprobs: int | None = None) -> None:
    engine.add_encoded_request(request_id, case["encoded"], _params(logprobs))


# -- rotary layout ---------------------------------------------------------------------------


def test_interleaved_mrope_layout_matches_transformers_recomposition(thinker):
    rotary = thinker.model.language_model.rotary_emb
    half = rotary.inv_freq.shape[0]
    rows = mrope_frequency_rows(half, rotary.mrope_section, interleaved=True)
    freq = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 1, 1, half).clone()
    assert torch.equal(rotary.recomposition_frequencies(freq)[0, 0, :half], rows.double())
    assert rows.tolist() == [0, 1, 2, 0, 1, 2, 0, 0]  # tiny section [4, 2, 2]
    plain = mrope_frequency_rows(8, [4, 2, 2], interleaved=False)
    assert plain.tolist() == [0, 0, 0, 0, 1, 1, 2, 2]


def test_rotary_tables_of_3d_positions_equal_transformers(ckpt, thinker, sync_engine):
    rotary = sync_engine.core.executor.runner.model.layers[0].self_attn.rotary
    positions = torch.randint(0, 200, (3, 50), generator=torch.Generator().manual_seed(0))
    positions[:, :5] = torch.arange(5)  # text-like columns: all rows equal
    x = torch.zeros(1, dtype=torch.float64)
    with torch.no_grad():
        cos, sin = thinker.model.language_model.rotary_emb(x, positions[:, None])
    ours_cos, ours_sin = rotary.tables(positions)
    assert torch.equal(ours_cos, cos[0]) and torch.equal(ours_sin, sin[0])
    # Equal rows give the 1-D table rows.
    one_d = rotary.tables(positions[0, :5])
    assert torch.equal(one_d[0], ours_cos[:5]) and torch.equal(one_d[1], ours_sin[:5])


# -- logits and tokens -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["image", "image_audio"])
def test_image_prompt_logits_tokens_and_talker_hidden_states(sync_engine, prompts, name):
    case = prompts[name]
    seen, observer = _record_logits(sync_engine)
    calls = _record_forward(sync_engine)
    hidden: list[torch.Tensor] = []
    sync_engine.core_output_listener = lambda rid, out: (
        hidden.append(out.hidden_states) if out.hidden_states is not None else None
    )
    try:
        _add(sync_engine, name, case, logprobs=3)
        out = _run(sync_engine)[name]
    finally:
        sync_engine.core_output_listener = None
        _stop_recording(sync_engine, observer)
    # 3-D positions and deepstack for the prompt only: the decode steps take the 1-D path.
    assert calls == [(2, True)] + [(1, False)] * (STEPS - 1)
    assert out.outputs[0].token_ids == case["tokens"]
    ours = torch.stack(seen[name]).double()
    torch.testing.assert_close(ours, case["logits"], **TOL)
    _check_logprobs(out, case["logits"])
    # The talker's rows of the prompt: input embeddings and the output of layer 0, before
    # deepstack added the visual features to it.
    length = len(case["encoded"].prompt_token_ids)
    rows = torch.cat(hidden)[:length]
    torch.testing.assert_close(rows, case["hidden"], **TOL)


def test_async_scheduling_gives_the_same_tokens_and_logprobs(ckpt, prompts, text_reference):
    engine = _engine(ckpt, async_scheduling=True, executor_backend="thread")
    try:
        for name, case in prompts.items():
            _add(engine, name, case, logprobs=3)
        engine.add_tokenized_request("text", None, TEXT_IDS, _params(3))
        done = _run(engine)
    finally:
        engine.shutdown()
    for name, case in prompts.items():
        assert done[name].outputs[0].token_ids == case["tokens"]
        _check_logprobs(done[name], case["logits"])
    assert done["text"].outputs[0].token_ids == text_reference["tokens"]
    _check_logprobs(done["text"], text_reference["logits"])


def test_chunked_prefill_batched_with_a_text_request(ckpt, prompts, text_reference):
    # 5-token chunks: boundaries fall inside the image tokens and between deepstack rows.
    engine = _engine(ckpt, max_num_batched_tokens=5, enable_chunked_prefill=True)
    seen, _ = _record_logits(engine)
    engine.add_tokenized_request("text", None, TEXT_IDS, _params())
    for name, case in prompts.items():
        _add(engine, name, case)
    done = _run(engine)
    for name, case in prompts.items():
        assert done[name].outputs[0].token_ids == case["tokens"]
        torch.testing.assert_close(torch.stack(seen[name]).double(), case["logits"], **TOL)
    assert done["text"].outputs[0].token_ids == text_reference["tokens"]
    text_logits = torch.stack(seen["text"]).double()
    torch.testing.assert_close(text_logits, text_reference["logits"], **TOL)


def test_text_request_logits_unchanged_next_to_an_image_request(
    sync_engine, prompts, text_reference
):
    seen, observer = _record_logits(sync_engine)
    calls = _record_forward(sync_engine)
    try:
        sync_engine.add_tokenized_request("alone", None, TEXT_IDS, _params())
        _run(sync_engine)
        assert calls == [(1, False)] * STEPS  # text only: the plain path
        sync_engine.add_tokenized_request("beside", None, TEXT_IDS[:-1] + [77], _params())
        _add(sync_engine, "img", prompts["image"])
        sync_engine.add_tokenized_request("text", None, TEXT_IDS, _params())
        done = _run(sync_engine)
    finally:
        _stop_recording(sync_engine, observer)
    assert done["text"].outputs[0].token_ids == text_reference["tokens"]
    alone, beside = torch.stack(seen["alone"]), torch.stack(seen["text"])
    torch.testing.assert_close(beside, alone, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(beside.double(), text_reference["logits"], **TOL)
    assert done["img"].outputs[0].token_ids == prompts["image"]["tokens"]


def test_preempted_image_requests_recompute_the_same_tokens(ckpt, prompts):
    # Room for both prompts (and their first token) but not for both to finish.
    lengths = [len(c["encoded"].prompt_token_ids) for c in prompts.values()]
    blocks = sum(-(-(n + 1) // 4) for n in lengths)
    engine = _engine(
        ckpt,
        block_size=4,
        num_kv_blocks=blocks,
        max_model_len=min(4 * blocks, max(lengths) + STEPS + 4),
        enable_prefix_caching=False,
    )
    for name, case in prompts.items():
        _add(engine, name, case, logprobs=2)
    done = _run(engine)
    assert engine.core.scheduler.num_preemptions > 0
    for name, case in prompts.items():
        assert done[name].outputs[0].token_ids == case["tokens"]
        _check_logprobs(done[name], case["logits"])


def test_decoder_inputs_cross_to_a_worker_process_intact(prompts):
    """What the process executor sends its worker: the runner gets equal tensors back."""
    from omnistage.core.process_executor import _ENCODER, _TO_WORKER, Step
    from omnistage.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput

    mm = MultimodalDecoderInputs.from_encoded_prompt(prompts["image_audio"]["encoded"])
    new = NewRequestData(
        req_id="r",
        prompt_token_ids=[1, 2],
        output_token_ids=[],
        sampling_params=_params(),
        sample_seed=0,
        block_ids=[1],
        num_computed_tokens=0,
        mm_decoder_inputs=mm.to_data(),
    )
    so = SchedulerOutput(
        scheduled_new_reqs=[new],
        scheduled_cached_reqs=CachedRequestData(),
        num_scheduled_tokens={"r": 2},
        total_num_scheduled_tokens=2,
        finished_req_ids=set(),
        preempted_req_ids=set(),
    )
    step = _TO_WORKER.decode(_ENCODER.encode(Step(scheduler_output=so)))
    data = step.scheduler_output.scheduled_new_reqs[0].mm_decoder_inputs
    back = MultimodalDecoderInputs.from_data(data, torch.device("cpu"), torch.float64)
    assert back.rope_delta == mm.rope_delta < 0
    for field in ("mrope_positions", "visual_pos_mask", "deepstack_embeds"):
        mine, theirs = getattr(back, field), getattr(mm, field)
        assert mine.dtype == theirs.dtype and torch.equal(mine, theirs), field
    assert back.digest() == mm.digest()


# -- prefix caching ---------------------------------------------------------------------------


def test_prefix_cache_is_shared_only_with_equal_positions_and_features(ckpt, prompts):
    engine = _engine(ckpt, block_size=4)
    case = prompts["image_audio"]
    encoded = case["encoded"]
    _add(engine, "first", case)
    _run(engine)
    _add(engine, "again", case)
    again = _run(engine)["again"]
    assert again.num_cached_tokens > 0
    assert again.outputs[0].token_ids == case["tokens"]
    # Same ids and embeddings, ordinary positions and no deepstack: a different KV cache.
    engine.add_tokenized_request(
        "plain", None, encoded.prompt_token_ids, _params(), prompt_embeds=encoded.prompt_embeds
    )
    plain = _run(engine)["plain"]
    assert plain.num_cached_tokens == 0
    # Same positions, other deepstack features: not shared either.
    mm = MultimodalDecoderInputs.from_encoded_prompt(encoded)
    mm.deepstack_embeds = mm.deepstack_embeds + 1.0
    engine.add_tokenized_request(
        "other",
        None,
        encoded.prompt_token_ids,
        _params(),
        prompt_embeds=encoded.prompt_embeds,
        mm_decoder_inputs=mm,
    )
    assert _run(engine)["other"].num_cached_tokens == 0


# -- refusals ---------------------------------------------------------------------------------


def test_bad_decoder_inputs_are_refused(sync_engine, prompts, tiny_llama_f64):
    encoded = prompts["image"]["encoded"]
    ids, length = encoded.prompt_token_ids, len(encoded.prompt_token_ids)
    good = MultimodalDecoderInputs.from_encoded_prompt(encoded)
    cases = [
        (dict(mrope_positions=good.mrope_positions[:, :-1]), "expected shape \\(3, "),
        (dict(mrope_positions=good.mrope_positions + 10**6), "must lie in"),
        (dict(rope_delta=3), "rope_delta must be an integer <= 0"),
        (dict(deepstack_embeds=good.deepstack_embeds[:, 1:]), "deepstack_embeds: expected"),
        (dict(visual_pos_mask=None), "go together"),
        (dict(deepstack_embeds=good.deepstack_embeds.expand(3, -1, -1)), "3 deepstack layers"),
    ]
    for change, match in cases:
        fields = dict(
            mrope_positions=good.mrope_positions,
            rope_delta=good.rope_delta,
            visual_pos_mask=good.visual_pos_mask,
            deepstack_embeds=good.deepstack_embeds,
        )
        fields.update(change)
        with pytest.raises(ValueError, match=match):
            sync_engine.add_tokenized_request(
                "bad", None, ids, _params(), mm_decoder_inputs=MultimodalDecoderInputs(**fields)
            )
    assert not sync_engine.has_unfinished_requests()
    llama = LLMEngine(
        EngineConfig(model=str(tiny_llama_f64), dtype="float64", async_scheduling=False)
    )
    with pytest.raises(ValueError, match="does not take 3-D"):
        llama.add_tokenized_request("x", None, [1] * length, _params(), mm_decoder_inputs=good)
