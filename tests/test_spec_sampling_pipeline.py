"""Speculation through the whole sampling pipeline, on float64 tiny models (issue 26, hole 4).

- Stage transitions on the engine (`</think>` -> `<recaption>`, a two-token forced
  sequence after `</recaption>`, a section budget): speculative decoding (an oracle whose
  drafts cross every forced position, n-gram lookup, the target as its own draft model)
  gives the tokens of plain decoding, sync and async, and every forced token stands
  where the rules put it.
- The same when the model's own `sample()` applies the transitions (HunyuanImage-style).
- A model whose `sample()` returns None is sampled by the engine's sampler: its outputs
  equal those of the same weights without a `sample()`.
- Order: logits processors and stage transitions run before the model's sampler sees
  the logits.
- A token history one token behind the step's positions is refused (issue 26, hole 5).
"""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.engine.llm_engine import LLMEngine
from omnistage.families.llama.model import LlamaForCausalLM
from omnistage.models.registry import register_model
from omnistage.sample import Sampler
from omnistage.sample.stage_transitions import SectionBudget, StageTransitions
from tests.test_async_equivalence import Spec, assert_nothing_held
from tests.test_spec_decode import OracleProposer, run, spec_engine

THINK_END, RECAPTION, RECAPTION_END, ANSWER, BOI = 40, 41, 42, 43, 44
RULES = {(THINK_END,): (RECAPTION,), (RECAPTION_END,): (ANSWER, BOI)}
CAPTION_BUDGET = 5
"""`</recaption>` is forced once this many tokens followed `<recaption>` without one."""
FAVOURITE, FOLLOWER = 45, 46
"""The order test: the model sampler picks FAVOURITE whenever its logit is finite;
an engine rule forces FOLLOWER after it."""


def think_transitions() -> StageTransitions:
    return StageTransitions(RULES, [SectionBudget(RECAPTION_END, CAPTION_BUDGET, RECAPTION)])


class TransitionSamplerModel(LlamaForCausalLM):
    """Applies the think/recaption transitions in its own sampler, then samples."""

    architectures = ("OmnistageSpecTransitionSampler",)
    prefer_model_sampler = True

    def __init__(self, config, dtype, max_positions):
        super().__init__(config, dtype, max_positions)
        self.transitions = think_transitions()
        self.sampler = Sampler()
        self.calls = 0

    def sample(self, logits, metadata):
        self.calls += 1
        self.transitions.apply(logits, metadata.output_token_ids)
        return self.sampler(logits, metadata)


class DecliningSamplerModel(LlamaForCausalLM):
    """Prefers its own sampler, which always declines (returns None)."""

    architectures = ("OmnistageSpecDecliningSampler",)
    prefer_model_sampler = True

    def __init__(self, config, dtype, max_positions):
        super().__init__(config, dtype, max_positions)
        self.calls = 0

    def sample(self, logits, metadata):
        self.calls += 1
        return None


class FavouriteSamplerModel(LlamaForCausalLM):
    """Picks FAVOURITE in every row where its logit is finite, else samples as usual: it
    emits FAVOURITE exactly where nothing before it masked it."""

    architectures = ("OmnistageSpecFavouriteSampler",)
    prefer_model_sampler = True

    def __init__(self, config, dtype, max_positions):
        super().__init__(config, dtype, max_positions)
        self.sampler = Sampler()

    def sample(self, logits, metadata):
        tokens = self.sampler(logits.clone(), metadata)
        return torch.where(torch.isfinite(logits[:, FAVOURITE]), FAVOURITE, tokens)


MODELS = {
    "plain": None,
    "transition-sampler": TransitionSamplerModel,
    "declining-sampler": DecliningSamplerModel,
    "favourite-sampler": FavouriteSamplerModel,
}
for _cls in MODELS.values():
    if _cls is not None:
        register_model(_cls)


@pytest.fixture(scope="module")
def checkpoints(tiny_llama_f64, tmp_path_factory) -> dict[str, str]:
    """The float64 tiny llama, and copies of it served by each test model class."""
    paths = {"plain": str(tiny_llama_f64)}
    for name, cls in MODELS.items():
        if cls is None:
            continue
        path = tmp_path_factory.mktemp(name)
        shutil.copytree(tiny_llama_f64, path, dirs_exist_ok=True)
        config = json.loads((path / "config.json").read_text())
        config["architectures"] = list(cls.architectures)
        (path / "config.json").write_text(json.dumps(config))
        paths[name] = str(path)
    return paths


class Engines:
    """Engines built on first use, keyed by (model, proposer, async, engine rules)."""

    def __init__(self, checkpoints: dict[str, str]) -> None:
        self.checkpoints = checkpoints
        self.made: dict[tuple, LLMEngine] = {}

    def get(
        self, model: str, proposer: str | None, async_scheduling: bool, rules: str | None = None
    ) -> LLMEngine:
        key = (model, proposer, async_scheduling, rules)
        if key not in self.made:
            path = self.checkpoints[model]
            spec = None
            if proposer in ("oracle", "ngram"):
                spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
            elif proposer == "draft-self":
                spec = {"method": "draft_model", "model": path, "num_speculative_tokens": 3}
            transitions, budgets = None, None
            if rules == "think":
                transitions = {k[0]: list(v) for k, v in RULES.items()}
                budgets = {RECAPTION_END: {"after": RECAPTION, "max_tokens": CAPTION_BUDGET}}
            elif rules == "favourite":
                transitions = {FAVOURITE: [FOLLOWER]}
            self.made[key] = spec_engine(
                path,
                spec,
                async_scheduling,
                proposer == "oracle",
                max_num_batched_tokens=32,
                max_model_len=128,
                stage_transitions=transitions,
                stage_budgets=budgets,
            )
        return self.made[key]

    def close(self) -> None:
        for engine in self.made.values():
            engine.shutdown()


@pytest.fixture(scope="module")
def engines(checkpoints):
    made = Engines(checkpoints)
    yield made
    made.close()


def think_workload() -> list[Spec]:
    """Greedy and random requests, some with repetitive prompts, `</think>` favoured."""
    rng = random.Random(26)
    specs = []
    for i in range(8):
        prompt = [rng.randrange(50, 250) for _ in range(rng.randrange(4, 20))]
        if i % 2:
            prompt = prompt[:6] * 3
        params = SamplingParams(
            temperature=0.0 if i % 3 == 0 else 1.0,
            seed=100 + i,
            max_tokens=40,
            ignore_eos=True,
            logit_bias={THINK_END: 3.0 if i % 3 == 0 else 5.0},
        )
        specs.append(Spec(prompt, params, i % 3, None))
    return specs


def spec_against_plain(
    engines: Engines,
    specs: list[Spec],
    model: str,
    proposer: str,
    async_scheduling: bool,
    rules: str | None,
) -> list[tuple[int, ...]]:
    """Run `specs` without speculation (sync) and with it; assert equal outputs and that
    drafts were accepted; return the token ids by request."""
    plain = engines.get(model, None, False, rules)
    spec = engines.get(model, proposer, async_scheduling, rules)
    expected = run(plain, specs)
    oracle = spec.core.executor.runner.proposer
    if isinstance(oracle, OracleProposer):
        oracle.expected = {req_id: out[0] for req_id, out in expected.items()}
    accepted = spec.core.scheduler.spec_stats.num_accepted_tokens
    assert run(spec, specs) == expected
    assert spec.core.scheduler.spec_stats.num_accepted_tokens > accepted
    assert_nothing_held(plain)
    assert_nothing_held(spec)
    return [expected[f"r{i}"][0] for i in range(len(specs))]


def assert_forced_where_due(outputs: list[tuple[int, ...]]) -> None:
    """At every position where the rules force a token, the output holds it; `</think>`
    is always followed by `<recaption>`; the rules fired many times."""
    rules = think_transitions()
    forced = 0
    for tokens in outputs:
        for p, token in enumerate(tokens):
            due = rules.forced_token(tokens[:p])
            if due is not None:
                forced += 1
                assert token == due, (tokens, p)
        for i in range(len(tokens) - 1):
            if tokens[i] == THINK_END:
                assert tokens[i + 1] == RECAPTION, tokens
    assert forced >= 60


SPEC_RUNS = [
    ("oracle", False),
    ("oracle", True),
    ("ngram", False),
    ("ngram", True),
    ("draft-self", True),
]


@pytest.mark.parametrize(("proposer", "async_scheduling"), SPEC_RUNS)
def test_speculation_with_engine_stage_transitions(engines, proposer, async_scheduling):
    outputs = spec_against_plain(
        engines, think_workload(), "plain", proposer, async_scheduling, "think"
    )
    assert_forced_where_due(outputs)


@pytest.mark.parametrize(("proposer", "async_scheduling"), SPEC_RUNS)
def test_speculation_with_a_model_owned_sampler(engines, proposer, async_scheduling):
    model = engines.get("transition-sampler", proposer, async_scheduling).core.executor.runner.model
    calls = model.calls
    outputs = spec_against_plain(
        engines, think_workload(), "transition-sampler", proposer, async_scheduling, None
    )
    assert model.calls > calls
    assert_forced_where_due(outputs)


def penalised_workload() -> list[Spec]:
    """Random and greedy requests using every logits processor, and logprobs."""
    rng = random.Random(5)
    specs = []
    for i in range(6):
        prompt = [rng.randrange(3, 250) for _ in range(rng.randrange(3, 24))]
        params = SamplingParams(
            temperature=0.0 if i == 0 else 0.8,
            top_p=0.9,
            seed=7 + i,
            max_tokens=16,
            presence_penalty=0.5,
            repetition_penalty=1.2,
            logit_bias={prompt[0]: 5.0, 60 + i: 4.0},
            min_tokens=3,
            stop_token_ids=[61],
            logprobs=2,
        )
        specs.append(Spec(prompt, params, i % 2, None))
    return specs


@pytest.mark.parametrize(
    ("proposer", "async_scheduling"), [(None, False), (None, True), ("ngram", True)]
)
def test_a_declining_model_sampler_falls_back_to_the_engine_sampler(
    engines, proposer, async_scheduling
):
    specs = penalised_workload()
    plain = engines.get("plain", None, False)
    declining = engines.get("declining-sampler", proposer, async_scheduling)
    model = declining.core.executor.runner.model
    calls = model.calls
    assert run(declining, specs) == run(plain, specs)
    assert model.calls > calls
    assert_nothing_held(declining)


@pytest.mark.parametrize(
    ("proposer", "async_scheduling"), [(None, False), (None, True), ("ngram", False)]
)
def test_processors_and_transitions_run_before_the_model_sampler(
    engines, proposer, async_scheduling
):
    """The model sampler picks FAVOURITE wherever its logit is still finite: min-tokens
    masks it for the first outputs (a stop token) and the rule after FAVOURITE forces
    FOLLOWER, so neither may be undone by the model sampler."""
    engine = engines.get("favourite-sampler", proposer, async_scheduling, "favourite")
    banned_first = SamplingParams(
        temperature=1.0, seed=3, max_tokens=8, min_tokens=4, stop_token_ids=[FAVOURITE]
    )
    free = SamplingParams(temperature=1.0, seed=4, max_tokens=8, ignore_eos=True)
    specs = [Spec([60, 70, 80], banned_first, 0, None), Spec([90, 100], free, 0, None)]
    out = run(engine, specs)
    banned, alternating = out["r0"][0], out["r1"][0]
    assert FAVOURITE not in banned[:4] and banned[4:] == (FAVOURITE,)
    assert alternating == (FAVOURITE, FOLLOWER) * 4
    assert_nothing_held(engine)


def test_a_history_one_token_behind_is_refused(checkpoints, caplog):
    """The runner checks each sampled history against the step's positions: a history
    that lacks the previous step's token (as if written late) stops the step by name; the
    engine pins the failed step on the request (`step_isolation`), which ends with
    finish reason "error", the check's message in the log."""
    engine = LLMEngine(
        EngineConfig(
            model=checkpoints["plain"],
            dtype="float64",
            async_scheduling=False,
            executor_backend="inline",
        )
    )
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    engine.add_request("behind", {"prompt_token_ids": [5, 6, 7]}, params)
    engine.step()
    engine.step()
    state = engine.core.executor.runner.requests["behind"]
    assert len(state.output_token_ids) == 2
    state.output_token_ids.pop()  # the history (only) is one token behind
    (out,) = engine.step()
    assert out.finished and out.outputs[0].finish_reason == "error"
    assert "samples output 2 but its token history holds 1" in caplog.text
    assert engine.core.scheduler.isolation.num_failed_steps == 1
    assert engine.num_free_kv_blocks() == engine.num_usable_kv_blocks()
    engine.shutdown()
