"""A prompt's per-token modality (`MultimodalDecoderInputs.token_modality`) reaches the model
for exactly the positions each step computes, on the tiny Ming-Omni thinker in float64
(its MoE routes image / audio positions through `image_gate` / `audio_gate`).

- the step's flat codes are the chunk's slice of the prompt's (a chunk boundary inside a
  span), zero for generated tokens and for rows without codes;
- the routing: an image (audio) position's MoE output is the one `image_gate`
  (`audio_gate`) picks, and the codes change the logits (the test can fail);
- chunked prefill ≡ whole prefill, batched ≡ alone, sync ≡ async (logits of every step
  bit for bit, greedy ids), a prefix-cache hit that resumes inside a span ≡ no hit, and prompts with
  other codes share no cached blocks;
- a request preempted (recomputed) gets its codes again, sync and async;
- bad codes are ValueErrors naming the field.
"""

from __future__ import annotations

import pytest
import torch

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.engine.llm_engine import LLMEngine
from omnistage.families.ming_omni.thinker import AUDIO, IMAGE
from omnistage.families.ming_omni.tiny import make_tiny_ming_omni
from omnistage.layers.forward_context import forward_context, get_forward_context

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
L = 50


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_ming_omni(tmp_path_factory.mktemp("ming-modality"), seed=0)


def engine(ckpt, **kw) -> LLMEngine:
    kw.setdefault("async_scheduling", False)
    kw.setdefault("executor_backend", "thread")  # the runner in this process (observed)
    return LLMEngine(EngineConfig(model=str(ckpt), model_part="thinker", dtype="float64", **kw))


def modality(*spans: tuple[int, int, int]) -> torch.Tensor:
    """[L] codes: `code` on positions [start, stop) of each (start, stop, code)."""
    kinds = torch.zeros(L, dtype=torch.int64)
    for start, stop, code in spans:
        kinds[start:stop] = code
    return kinds


PROMPTS = {
    "image": (list(range(20, 20 + L)), modality((5, 30, IMAGE))),
    "audio": (list(range(70, 70 + L)), modality((12, 44, AUDIO))),
    "both": (list(range(120, 120 + L)), modality((3, 17, IMAGE), (21, 48, AUDIO))),
    "text": (list(range(30, 30 + L)), None),
}


def run(eng: LLMEngine, names: list[str], prompts=PROMPTS, params=GREEDY) -> dict[str, tuple]:
    """Each request's greedy ids and the logits of its every sampling step."""
    logits: dict[str, list[torch.Tensor]] = {}

    def observe(event) -> None:
        for i, rid in enumerate(event.req_ids):
            logits.setdefault(rid, []).append(event.logits[i].clone())

    eng.core.executor.runner.add_sample_observer(observe)
    for name in names:
        ids, kinds = prompts[name]
        mm = None if kinds is None else MultimodalDecoderInputs(token_modality=kinds.clone())
        eng.add_tokenized_request(name, None, ids, params, mm_decoder_inputs=mm)
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    return {n: (done[n], torch.stack(logits[n])) for n in names}


def same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name][0] == b[name][0], name
        assert torch.equal(a[name][1], b[name][1]), name


def test_each_step_gets_its_chunk_of_the_codes(ckpt):
    eng = engine(ckpt, max_num_batched_tokens=16, enable_prefix_caching=False)
    seen: list[torch.Tensor | None] = []
    model = eng.core.executor.runner.model

    def hook(module, args) -> None:
        kinds = get_forward_context().token_modality
        seen.append(None if kinds is None else kinds.clone())

    model.register_forward_pre_hook(hook)
    run(eng, ["both"])
    # 16-token chunks: [0,16) [16,32) [32,48) [48,50) then decodes (all text: None).
    kinds = PROMPTS["both"][1]
    assert [None if s is None else len(s) for s in seen[:4]] == [16, 16, 16, None]
    assert torch.equal(torch.cat(seen[:3]), kinds[:48])  # the last 2 prompt tokens are text
    assert all(s is None for s in seen[4:])


def test_batched_step_lays_codes_out_row_by_row(ckpt):
    eng = engine(ckpt, enable_prefix_caching=False)
    seen: list[torch.Tensor | None] = []
    model = eng.core.executor.runner.model
    model.register_forward_pre_hook(lambda m, a: seen.append(get_forward_context().token_modality))
    run(eng, ["text", "image", "audio"])
    expected = torch.cat(
        [torch.zeros(L, dtype=torch.int64), PROMPTS["image"][1], PROMPTS["audio"][1]]
    )
    assert torch.equal(seen[0], expected)


def test_image_and_audio_positions_route_through_their_gates(ckpt):
    eng = engine(ckpt)
    model = eng.core.executor.runner.model
    moe = next(layer.mlp for layer in model.layers if hasattr(layer.mlp, "image_gate"))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, moe.gate.weight.shape[1], generator=g, dtype=torch.float64)
    residual = torch.randn(x.shape, generator=g, dtype=torch.float64)
    kinds = torch.tensor([0, IMAGE, AUDIO, IMAGE, 0, AUDIO])

    def out(codes: torch.Tensor | None) -> torch.Tensor:
        with forward_context(_Meta(codes)):
            return moe(x.clone(), residual.clone())

    def routed_by(gate) -> torch.Tensor:
        saved = moe.gate.weight.clone()
        moe.gate.weight.copy_(gate.weight)
        try:
            return out(None)
        finally:
            moe.gate.weight.copy_(saved)

    mixed, text = out(kinds), out(None)
    image, audio = routed_by(moe.image_gate), routed_by(moe.audio_gate)
    for i, code in enumerate(kinds.tolist()):
        expected = {0: text, IMAGE: image, AUDIO: audio}[code][i]
        torch.testing.assert_close(mixed[i], expected, rtol=0, atol=1e-12)
    assert not torch.allclose(image, text) and not torch.allclose(audio, text)


class _Meta:
    """A forward context that only carries codes (the MoE block reads nothing else)."""

    def __init__(self, codes: torch.Tensor | None) -> None:
        self.token_modality = codes


def test_codes_change_the_logits(ckpt):
    with_codes = run(engine(ckpt), ["image"])
    without = run(engine(ckpt), ["image"], {"image": (PROMPTS["image"][0], None)})
    assert not torch.allclose(with_codes["image"][1][0], without["image"][1][0])


@pytest.fixture(scope="module")
def alone(ckpt):
    """Each prompt alone, whole prefill."""
    return {n: run(engine(ckpt, enable_prefix_caching=False), [n])[n] for n in PROMPTS}


@pytest.mark.parametrize("budget", [7, 16, 23])
def test_chunked_prefill_equals_whole_prefill(ckpt, alone, budget):
    settings = dict(enable_prefix_caching=False, max_num_batched_tokens=budget)
    for n in ["image", "audio", "both"]:
        chunked = run(engine(ckpt, **settings), [n])[n]
        assert chunked[0] == alone[n][0], n
        assert torch.equal(chunked[1], alone[n][1])


def test_batched_equals_alone_and_sync_equals_async(ckpt, alone):
    names = ["image", "audio", "both", "text"]
    settings = dict(enable_prefix_caching=False, max_num_batched_tokens=37)
    batched = run(engine(ckpt, **settings), names)
    for n in names:
        assert batched[n][0] == alone[n][0], n
        assert torch.equal(batched[n][1], alone[n][1])
    same(run(engine(ckpt, async_scheduling=True, **settings), names), batched)


def test_preempted_requests_get_their_codes_again(ckpt):
    """A tiny KV cache preempts requests (recompute): their codes come back with them."""
    names = ["image", "audio", "both", "text"]
    longer = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)  # past 4 blocks
    alone = {
        n: run(engine(ckpt, enable_prefix_caching=False), [n], params=longer)[n] for n in names
    }
    for async_scheduling in (False, True):
        eng = engine(
            ckpt,
            async_scheduling=async_scheduling,
            enable_prefix_caching=False,
            num_kv_blocks=9,
            max_model_len=128,
            block_size=16,
            max_num_batched_tokens=40,
        )
        got = run(eng, names, params=longer)
        assert eng.core.scheduler.num_preemptions > 0
        for n in names:
            assert got[n][0] == alone[n][0], n
            assert torch.equal(got[n][1], alone[n][1])


def test_prefix_hit_inside_a_span_and_no_sharing_across_codes(ckpt):
    ids = list(range(200, 200 + L))
    inside = modality((20, 49, IMAGE))  # 48 cached tokens: the hit resumes inside the span
    prompts = {
        "a": (ids, inside),
        "b": (ids, inside.clone()),
        "c": (ids, modality((20, 49, AUDIO))),
    }
    eng = engine(ckpt)
    kv = eng.kv_cache_manager
    first = run(eng, ["a"], prompts)
    hits = kv.prefix_hits
    other = run(eng, ["c"], prompts)
    assert kv.prefix_hits == hits  # other codes, same ids: nothing shared
    again = run(eng, ["b"], prompts)
    assert kv.prefix_hits == hits + 48
    assert again["b"][0] == first["a"][0]
    assert torch.equal(again["b"][1], first["a"][1])
    assert not torch.allclose(other["c"][1][0], first["a"][1][0])
    fresh = run(engine(ckpt, enable_prefix_caching=False), ["c"], prompts)
    same(fresh, other)
    assert kv.num_requests == 0


@pytest.mark.parametrize(
    ("kinds", "match"),
    [
        (torch.zeros(L - 1, dtype=torch.int64), r"token_modality: expected shape \(50,\)"),
        (torch.zeros(L), "token_modality: must be an integer"),
        (torch.full((L,), 3), r"token_modality: values must be 0 \(text\) or one of 1 image"),
        (torch.full((L,), -1), "token_modality: values must be"),
    ],
)
def test_bad_codes_are_value_errors(ckpt, kinds, match):
    eng = engine(ckpt)
    mm = MultimodalDecoderInputs(token_modality=kinds)
    with pytest.raises(ValueError, match=match):
        eng.add_tokenized_request("x", None, list(range(20, 20 + L)), GREEDY, mm_decoder_inputs=mm)
    assert not eng.has_unfinished_requests()


def test_a_model_without_modalities_refuses_codes(tiny_llama_f64):
    eng = LLMEngine(EngineConfig(model=str(tiny_llama_f64), dtype="float64"))
    mm = MultimodalDecoderInputs(token_modality=torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="token_modality: this model takes no per-token"):
        eng.add_tokenized_request("x", None, [5, 6, 7, 8], GREEDY, mm_decoder_inputs=mm)


def test_codes_cross_the_wire_and_salt_the_digest():
    kinds = modality((5, 30, IMAGE))
    mm = MultimodalDecoderInputs(token_modality=kinds)
    back = MultimodalDecoderInputs.from_data(mm.to_data(), torch.device("cpu"), torch.float64)
    assert torch.equal(back.token_modality, kinds) and back.token_modality.dtype == torch.int64
    same_codes = MultimodalDecoderInputs(token_modality=kinds.clone()).digest()
    other = MultimodalDecoderInputs(token_modality=modality((5, 30, AUDIO))).digest()
    assert mm.digest() == same_codes != other
    assert MultimodalDecoderInputs().digest() != mm.digest()


def test_an_encoded_prompt_with_codes_only_keeps_plain_positions():
    from omnistage.families.ming_omni.input_encoder import MingEncodedPrompt

    kinds = modality((5, 30, IMAGE))
    prompt = MingEncodedPrompt(
        prompt_token_ids=list(range(L)),
        prompt_embeds=torch.zeros(L, 4),
        mrope_positions=torch.arange(L).expand(3, -1),
        rope_delta=0,
        audio_mask=torch.zeros(L, dtype=torch.bool),
        visual_pos_mask=kinds > 0,
        deepstack_embeds=[],
        audio_token_counts=[],
        image_grid_thw=torch.tensor([[1, 10, 10]]),
        token_modality=kinds,
    )
    mm = MultimodalDecoderInputs.from_encoded_prompt(prompt)
    assert mm.mrope_positions is None and mm.deepstack_embeds is None
    assert torch.equal(mm.token_modality, kinds)
