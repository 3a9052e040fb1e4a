"""HunyuanImage-3's autoregressive MoE stage on a tiny float64 checkpoint with the real
parameter names (`families/hunyuan_image3/tiny.py`).

- Weights load by the checkpoint's names: every decoder tensor is used, the image head's
  are skipped, an unknown or misshapen tensor is refused by name.
- Its own sampler (`prefer_model_sampler`), reached through the one sampling dispatch:
  `</think>` is always followed by `<recaption>`, `</recaption>` by `<answer> <boi>
  <img_size>`, then one ratio token (the most likely) and the end; sync and async give
  the same token ids, alone or batched; under async the token after `</think>` is
  sampled in a step scheduled while the `</think>` was still in flight, and the sampler
  never sees a placeholder.
- With n-gram speculative decoding, greedy output equals greedy output without it.
- The config refuses, by field, what the decoder does not build (MLA, CLA, other RoPE,
  per-layer lists of the wrong length, ...).
"""

from __future__ import annotations

import random

import pytest
from safetensors.torch import load_file

from omnistage import LLM, SamplingParams
from omnistage.families.hunyuan_image3.model import IMAGE_HEAD_PREFIXES
from omnistage.families.hunyuan_image3.tiny import make_tiny_hunyuan_image3, token_ids
from omnistage.families.hunyuan_image3.tokens import NUM_RATIOS
from tests.scheduling_probe import SchedulingProbe

IDS = token_ids()
THINK, END_THINK = IDS["<think>"], IDS["</think>"]
RECAPTION, END_RECAPTION = IDS["<recaption>"], IDS["</recaption>"]
ANSWER, BOI, SIZE = IDS["<answer>"], IDS["<boi>"], IDS["<img_size_256>"]
RATIOS = {IDS[f"<img_ratio_{i}>"] for i in range(NUM_RATIOS + 4)}
EOS = 2
# Favour closing each section and disfavour ending early, so the random thinker walks
# through all of them (the forced tokens override any bias).
BIAS = {END_THINK: 4.0, END_RECAPTION: 3.0, EOS: -4.0, **{r: -4.0 for r in RATIOS}}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_hunyuan_image3(tmp_path_factory.mktemp("hunyuan_image3"), seed=0)


def make_llm(path, async_scheduling: bool, **kwargs) -> LLM:
    return LLM(
        str(path),
        dtype="float64",
        async_scheduling=async_scheduling,
        executor_backend="thread",
        max_model_len=128,
        **kwargs,
    )


def workload(n: int) -> tuple[list[dict], list[SamplingParams]]:
    prompts = [
        {"prompt_token_ids": [THINK] + [random.Random(i).randrange(3, 250) for _ in range(6)]}
        for i in range(n)
    ]
    params = [
        SamplingParams(temperature=1.0, seed=i, max_tokens=40, logit_bias=BIAS) for i in range(n)
    ]
    return prompts, params


def generate(llm: LLM, prompts, params) -> list[list[int]]:
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.engine.num_free_kv_blocks() == llm.engine.num_usable_kv_blocks()
    return [list(o.outputs[0].token_ids) for o in outs]


def check_sections(tokens: list[int]) -> int:
    """Assert the forced sections; returns how many `</think>` it holds."""
    fired = 0
    for i, t in enumerate(tokens[:-1]):
        after = tokens[i + 1]
        if t == END_THINK:
            fired += 1
            assert after == RECAPTION, tokens
        elif t == END_RECAPTION:
            assert tokens[i + 1 : i + 4] == [ANSWER, BOI, SIZE][: len(tokens) - i - 1], tokens
        elif t == SIZE and tokens[i - 1] == BOI:
            assert after in RATIOS, tokens
        elif t in RATIOS:
            assert after == EOS, tokens
    return fired


def test_weights_load_by_checkpoint_names(ckpt, tmp_path):
    names = set(load_file(str(ckpt / "model.safetensors")))
    assert "model.layers.1.mlp.experts.3.gate_and_up_proj.weight" in names
    assert "model.layers.0.mlp.gate_and_up_proj.weight" in names  # the dense first layer
    assert {"model.wte.weight", "model.ln_f.weight", "lm_head.weight"} <= names
    head = {n for n in names if n.startswith(IMAGE_HEAD_PREFIXES)}
    assert "final_layer.model.1.2.weight" in head and "patch_embed.model.0.weight" in head
    names -= head  # the image head's: not the AR stage's
    llm = make_llm(ckpt, False)
    model = llm.engine.core.executor.runner.model
    assert model.expected_weight_names() == names
    weights = load_file(str(ckpt / "model.safetensors"))
    assert (
        model.load_weights(
            {**weights, "vae.decoder.conv_in.weight": weights["lm_head.weight"]}.items()
        )
        == names
    )
    with pytest.raises(ValueError, match="model.layers.9.mlp.gate.wg.weight"):
        model.load_weights([("model.layers.9.mlp.gate.wg.weight", weights["lm_head.weight"])])
    with pytest.raises(ValueError, match="shape"):
        model.load_weights([("model.ln_f.weight", weights["lm_head.weight"])])


def test_missing_special_token_is_refused_by_name(tmp_path):
    path = make_tiny_hunyuan_image3(tmp_path / "ckpt", seed=0)
    text = (path / "tokenizer.json").read_text().replace('"</recaption>"', '"</caption>"')
    (path / "tokenizer.json").write_text(text)
    with pytest.raises(ValueError, match="</recaption>"):
        make_llm(path, False)


def test_sections_forced_sync_equals_async_alone_equals_batched(ckpt):
    prompts, params = workload(24)
    sync = generate(make_llm(ckpt, False, max_num_seqs=24), prompts, params)
    llm = make_llm(ckpt, True, max_num_seqs=24)
    with SchedulingProbe(llm.engine.core) as probe:
        batched = generate(llm, prompts, params)
    assert probe.most_in_flight == 1 and probe.most_placeholders > 0  # really async
    assert batched == sync
    alone = [generate(llm, [prompts[i]], [params[i]])[0] for i in (0, 7, 13)]
    assert alone == [sync[i] for i in (0, 7, 13)]
    assert sum(check_sections(t) for t in sync) >= 20  # the transition really fired
    assert sum(any(t in RATIOS for t in tokens) for tokens in sync) >= 12  # and the ratio


def test_recaption_forced_while_think_end_in_flight(ckpt):
    """Under async, the step that samples after `</think>` was scheduled while the step
    sampling `</think>` had not returned; the model's sampler still sees `</think>`."""
    llm = make_llm(ckpt, True, max_num_seqs=8)
    scheduler = llm.engine.core.scheduler
    model = llm.engine.core.executor.runner.model
    scheduled: dict[str, list[tuple[int, int]]] = {}
    schedule, sample = scheduler.schedule, model.sample

    def recording_schedule():
        out = schedule()
        for rid in out.num_scheduled_tokens:
            req = scheduler.requests[rid]
            scheduled.setdefault(rid, []).append(
                (len(req.output_token_ids), req.num_output_placeholders)
            )
        return out

    forced_in_flight = events = 0

    def checking_sample(logits, metadata):
        nonlocal forced_in_flight, events
        for rid, history in zip(metadata.req_ids, metadata.output_token_ids, strict=True):
            assert all(0 <= t < logits.shape[1] for t in history), history
            if not history or history[-1] != END_THINK:
                continue
            # The step sampling output position n = len(history) was scheduled with
            # `confirmed` real outputs and `placeholders` in flight (its own included):
            # confirmed + placeholders - 1 == n. `</think>` (position n - 1) was in
            # flight then when confirmed < n.
            n = len(history)
            (confirmed,) = [c for c, p in scheduled[rid] if c + p - 1 == n][-1:]
            forced_in_flight += confirmed < n
            events += 1
        tokens = sample(logits, metadata)
        for row, history in enumerate(metadata.output_token_ids):
            if history and history[-1] == END_THINK:
                assert int(tokens[row]) == RECAPTION
        return tokens

    scheduler.schedule, model.sample = recording_schedule, checking_sample
    prompts, params = workload(8)
    outs = generate(llm, prompts, params)
    assert sum(check_sections(t) for t in outs) >= 4
    assert events >= 4 and forced_in_flight == events, (forced_in_flight, events)


def test_greedy_with_ngram_speculation_equals_without(ckpt):
    prompts, _ = workload(6)
    params = [SamplingParams(temperature=0.0, max_tokens=40, logit_bias=BIAS) for _ in prompts]
    plain = generate(make_llm(ckpt, False), prompts, params)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    for async_scheduling in (False, True):
        llm = make_llm(ckpt, async_scheduling, speculative_config=spec)
        assert generate(llm, prompts, params) == plain
        stats = llm.engine.core.scheduler.spec_stats
        assert stats.num_accepted_tokens > 0 and stats.num_accepted_tokens < stats.num_draft_tokens
    assert sum(check_sections(t) for t in plain) >= 3


def test_config_refuses_what_the_decoder_does_not_build_by_name():
    from omnistage.families.hunyuan_image3.config import HunyuanImage3Config
    from omnistage.families.hunyuan_image3.tiny import TINY_CONFIG

    HunyuanImage3Config(**TINY_CONFIG)  # the tiny config is valid
    for change, field in [
        ({"use_mla": True}, "use_mla"),
        ({"use_cla": True}, "use_cla"),
        ({"moe_topk": [2, 2]}, "moe_topk"),  # one per layer: 3 layers
        ({"moe_topk": 5}, "moe_topk"),  # more than the 4 experts
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ]:
        with pytest.raises(ValueError, match=field):
            HunyuanImage3Config(**{**TINY_CONFIG, **change})
    layer = HunyuanImage3Config(**{**TINY_CONFIG, "moe_topk": 3}).layer_moe(1)
    assert (layer.num_experts, layer.top_k, layer.intermediate, layer.num_shared) == (4, 3, 32, 1)
    assert HunyuanImage3Config(**TINY_CONFIG).layer_moe(0) is None  # moe_layer_num_skipped
