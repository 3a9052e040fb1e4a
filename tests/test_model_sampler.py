"""Model-owned samplers and stage transitions, sync and async (sources 000 and 001).

- `</think>` is always followed by `<recaption>` when a model's own sampler
  applies the stage transitions, at temperature 1.0, sync and async.
- A model sampler that checks every history it is given never sees a
  placeholder or a token that is not (yet) real, under async with batch churn.
- Every platform runner class reaches the model-sampler dispatch, and none (found by
  importing the package, not listed) overrides a method of the shared step.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from omnistage import LLM, SamplingParams
from omnistage.families.llama.model import LlamaForCausalLM
from omnistage.models.registry import register_model
from omnistage.models.tiny_checkpoints import make_checkpoint
from omnistage.platforms import runner_classes
from omnistage.platforms.interface import Platform
from omnistage.sample import Sampler
from omnistage.sample.stage_transitions import StageTransitions
from omnistage.worker.model_runner import ModelRunner
from omnistage.worker.sampling_dispatch import SamplingDispatch

THINK_TOKENS = ["<think>", "</think>", "<recaption>", "</recaption>", "<answer>", "<boi>"]


class ThinkRecaptionTestModel(LlamaForCausalLM):
    """A tiny thinker whose own sampler applies the stage transitions from its config."""

    architectures = ("OmnistageThinkRecaptionTest",)
    prefer_model_sampler = True

    def __init__(self, config, dtype, max_positions):
        super().__init__(config, dtype, max_positions)
        self.transitions = StageTransitions({tuple(k): v for k, v in config.stage_transition_ids})
        self.sampler = Sampler()
        self.calls = 0

    def sample(self, logits, metadata):
        self.calls += 1
        for history in metadata.output_token_ids:
            if any((not isinstance(t, int)) or t < 0 or t >= logits.shape[1] for t in history):
                raise AssertionError(f"model sampler got a placeholder in its history: {history}")
        self.transitions.apply(logits, metadata.output_token_ids)
        return self.sampler(logits, metadata)


register_model(ThinkRecaptionTestModel)


@pytest.fixture(scope="module")
def think_ckpt(tmp_path_factory):
    path = make_checkpoint(
        tmp_path_factory.mktemp("think"), "llama", seed=3, extra_special_tokens=THINK_TOKENS
    )
    ids = {tok: 259 + i for i, tok in enumerate(THINK_TOKENS)}
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["OmnistageThinkRecaptionTest"]
    config["stage_transition_ids"] = [
        [[ids["</think>"]], [ids["<recaption>"]]],
        [[ids["</recaption>"]], [ids["<answer>"], ids["<boi>"]]],
    ]
    (path / "config.json").write_text(json.dumps(config))
    return path, ids


def run_think(path, ids, async_scheduling: bool):
    # The test model class is registered in this process only: keep the runner in-process.
    llm = LLM(
        str(path), async_scheduling=async_scheduling, max_num_seqs=64, executor_backend="thread"
    )
    bias = {ids["</think>"]: 4.0, ids["</recaption>"]: 3.0}
    params = [
        SamplingParams(temperature=1.0, seed=i, max_tokens=24, logit_bias=bias, ignore_eos=True)
        for i in range(200)
    ]
    prompts = [
        {
            "prompt_token_ids": [ids["<think>"]]
            + [random.Random(i).randrange(3, 250) for _ in range(5)]
        }
        for i in range(200)
    ]
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert llm.engine.core.executor.runner.model.calls > 0
    assert llm.engine.num_free_kv_blocks() == llm.engine.num_usable_kv_blocks()
    return outs


def test_recaption_always_follows_think_sync_and_async(think_ckpt):
    path, ids = think_ckpt
    results = {mode: run_think(path, ids, mode) for mode in (False, True)}
    assert results[False] == results[True]
    triggered = 0
    for tokens in results[True]:
        for i, t in enumerate(tokens[:-1]):
            if t == ids["</think>"]:
                triggered += 1
                assert tokens[i + 1] == ids["<recaption>"]
            if t == ids["</recaption>"]:
                assert tokens[i + 1] == ids["<answer>"]
                if i + 2 < len(tokens):
                    assert tokens[i + 2] == ids["<boi>"]
    assert triggered >= 100  # the transition really fired, many times


def test_stage_transitions_by_configuration(think_ckpt, tiny_llama):
    """Attached to a plain model through the engine argument, by token strings."""
    path, ids = think_ckpt
    llm = LLM(
        str(path),
        stage_transitions={"</think>": ["<recaption>", "<answer>"]},
        executor_backend="thread",
    )
    forced_think = SamplingParams(
        temperature=1.0, seed=5, max_tokens=6, logit_bias={ids["</think>"]: 100.0}
    )
    llm.engine.core.executor.runner.model.transitions = StageTransitions(
        {}
    )  # only the engine's rules
    tokens = (
        llm.generate({"prompt_token_ids": [5, 6, 7]}, forced_think, use_tqdm=False)[0]
        .outputs[0]
        .token_ids
    )
    assert tokens[:3] == [ids["</think>"], ids["<recaption>"], ids["<answer>"]]
    with pytest.raises(ValueError, match="stage_transitions"):
        LLM(
            str(path),
            stage_transitions={"</think>": ["<no-such-token>"]},
            executor_backend="thread",
        )


def test_model_sampler_sees_only_real_history_under_async_churn(think_ckpt):
    path, _ = think_ckpt
    llm = LLM(
        str(path),
        async_scheduling=True,
        executor_backend="thread",
        max_num_seqs=8,
        num_kv_blocks=8,
        block_size=16,
        max_model_len=64,
        max_num_batched_tokens=48,
    )
    model = llm.engine.core.executor.runner.model
    seen: dict[str, list[list[int]]] = {}
    inner = model.sample

    def recording(logits, metadata):
        # That each history holds every token sampled before this step is checked by the
        # runner against the step's positions (tests/test_spec_sampling_pipeline.py).
        for req_id, history in zip(metadata.req_ids, metadata.output_token_ids, strict=True):
            seen.setdefault(req_id, []).append(list(history))
        return inner(logits, metadata)

    model.sample = recording
    engine = llm.engine
    rng = random.Random(0)
    finals: dict[str, list[int]] = {}
    aborted = set()
    for step in range(400):
        if step < 300 and rng.random() < 0.6:
            rid = f"q{step}"
            engine.add_request(
                rid,
                {"prompt_token_ids": [rng.randrange(3, 250) for _ in range(rng.randrange(1, 40))]},
                SamplingParams(
                    temperature=1.0, seed=step, max_tokens=rng.randrange(1, 10), ignore_eos=True
                ),
            )
        if rng.random() < 0.05 and engine._tracked:
            victim = rng.choice(sorted(engine._tracked))
            engine.abort_request(victim)
            aborted.add(victim)
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out.outputs[0].token_ids
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out.outputs[0].token_ids
    assert engine.core.scheduler.num_preemptions > 0
    assert len(finals) > 100
    for rid, final in finals.items():
        for history in seen.get(rid, []):
            assert final[: len(history)] == history  # every history was a true prefix
    assert engine.num_free_kv_blocks() == engine.num_usable_kv_blocks()
    stats = engine.core.executor.runner_stats()
    assert stats["batch_rows"] == 0 and stats["requests"] == 0


def omnistage_subclasses(base: type) -> set[type]:
    """Every subclass of `base` defined in omnistage, at any depth, found by importing every
    module of the package first (so a new platform's class cannot be missed; a module that
    needs Triton is skipped where it is not installed)."""
    import importlib
    import pkgutil

    import omnistage

    for module in pkgutil.walk_packages(omnistage.__path__, "omnistage."):
        if module.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(module.name)
        except ModuleNotFoundError as missing:  # the Triton kernels, on a CPU-only install
            if missing.name != "triton":
                raise
    found, todo = set(), [base]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("omnistage."):  # not a test's own subclass
                found.add(sub)
    return found


def overrides_of_the_base_runner(cls: type[ModelRunner]) -> set[str]:
    """The methods (and properties) of `ModelRunner`, its own or inherited short of `object`,
    that `cls` or a class between it and `ModelRunner` defines again."""
    base = {
        name
        for klass in ModelRunner.__mro__[:-1]
        for name, value in vars(klass).items()
        if callable(value) or isinstance(value, property | classmethod | staticmethod)
    }
    between = cls.__mro__[: cls.__mro__.index(ModelRunner)]
    return {name for klass in between for name in vars(klass) if name in base}


def test_platform_runners_are_all_listed_and_add_device_details_only():
    """Source 001: a platform runner that redefined part of the step path silently skipped
    the model sampler. So the step, from `execute_model` through sampling and the sampling
    dispatch, is written once in `ModelRunner` (DESIGN.md section 5), and a runner of any
    platform overrides none of its methods. Every runner omnistage defines is found, not
    listed here, and each must be one `runner_classes()` hands to the dispatch test below."""
    runners = omnistage_subclasses(ModelRunner)
    assert runners == set(runner_classes().values())
    assert {p.runner_class for p in omnistage_subclasses(Platform)} <= runners | {ModelRunner}
    overridden = {
        c.__name__: sorted(found) for c in runners if (found := overrides_of_the_base_runner(c))
    }
    assert not overridden, f"platform runners override the shared step: {overridden}"


@pytest.mark.parametrize("name", sorted(runner_classes()))
def test_every_platform_runner_reaches_the_model_sampler(name, think_ckpt):
    cls = runner_classes()[name]
    assert issubclass(cls, ModelRunner) and not overrides_of_the_base_runner(cls)
    # The dispatch really runs through this class (on CPU tensors for the CUDA class too).
    path, _ = think_ckpt
    llm = LLM(str(path), async_scheduling=False)
    runner = llm.engine.core.executor.runner
    runner.__class__ = cls
    assert type(runner.sampling) is SamplingDispatch  # the one dispatch, not a platform's
    before = runner.model.calls
    llm.generate("hi", SamplingParams(max_tokens=3), use_tqdm=False)
    assert runner.model.calls == before + 3
    assert isinstance(runner, cls) and torch.is_tensor(runner.kv_caches[0])


def test_section_budgets_force_the_close_token() -> None:
    """A thinking budget: `</think>` after 3 thought tokens; `</recaption>` 2 tokens after the
    `<recaption>` that opened the caption; nothing forced once a section is closed."""
    ids = {"</think>": 10, "<recaption>": 11, "</recaption>": 12}
    transitions = StageTransitions.from_config(
        {"</think>": ["<recaption>"]},
        ids.get,
        {"</think>": {"max_tokens": 3}, "</recaption>": {"after": "<recaption>", "max_tokens": 2}},
    )
    assert transitions.forced_token([1, 2]) is None
    assert transitions.forced_token([1, 2, 3]) == 10
    assert transitions.forced_token([1, 2, 3, 10]) == 11  # the rule, before any budget
    assert transitions.forced_token([1, 2, 3, 10, 11, 4]) is None
    assert transitions.forced_token([1, 2, 3, 10, 11, 4, 5]) == 12
    assert transitions.forced_token([1, 2, 3, 10, 11, 11, 5]) == 12  # a second open: no restart
    assert transitions.forced_token([1, 2, 3, 10, 11, 4, 5, 12, 6, 7, 8]) is None
    assert transitions.forced_token([1, 2, 3, 10, 11, 4, 5, 12, 11, 6, 7]) == 12  # reopened
    logits = torch.zeros(1, 16)
    transitions.apply(logits, [[1, 2, 3]])
    assert logits[0].argmax() == 10 and torch.isinf(logits[0, :10]).all()
    with pytest.raises(ValueError, match=r"stage_budgets\['</think>'\].max_tokens"):
        StageTransitions.from_config({}, ids.get, {"</think>": {"max_tokens": -1}})
    with pytest.raises(ValueError, match="not in the vocabulary"):
        StageTransitions.from_config({}, ids.get, {"</nope>": {"max_tokens": 1}})
