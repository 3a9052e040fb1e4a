"""Speculative decoding ≡ no speculation, token for token, on float64 tiny models.

Hypothesis draws workloads with heavy batch churn (requests arriving and
finishing every few steps, so rows are removed and compacted), aborts in
flight, chunked prefill, prefix sharing and preemption under a tiny KV budget,
greedy and random sampling, stop tokens and strings, logprobs and penalties.
Each runs without speculation and with it (n-gram and draft-model proposers,
sync and async scheduling); outputs must be identical and nothing may be held
afterwards. Random sampling is identical too: the target's token at every
verified position comes from the request's own stream keyed by output position
(spec_decode/verify.py).

The default suite runs 50 workloads of at least 4 generations each; the soak
suite (`pytest -m soak`) runs 500.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omnistage import LLM, SamplingParams
from omnistage.config import EngineConfig
from omnistage.engine.llm_engine import LLMEngine
from omnistage.models.tiny_checkpoints import make_checkpoint
from omnistage.spec_decode.config import SpeculativeConfig
from tests.test_async_equivalence import Spec, assert_nothing_held

ENGINE_SETTINGS = {
    "roomy": dict(max_num_batched_tokens=2048, max_model_len=160),
    "chunked": dict(max_num_batched_tokens=24, max_model_len=160),
    "preempting": dict(
        num_kv_blocks=10, block_size=16, max_num_batched_tokens=64, max_model_len=160
    ),
    "few-seqs": dict(enable_prefix_caching=False, max_num_seqs=3, max_model_len=160),
}
PROPOSERS = ("ngram", "draft-self", "draft-small")


@pytest.fixture(scope="module")
def draft_small(tmp_path_factory):
    """A one-layer draft of the same tokenizer (its drafts are mostly rejected)."""
    return make_checkpoint(
        tmp_path_factory.mktemp("draft-small"),
        "llama",
        seed=5,
        dtype=torch.float64,
        num_hidden_layers=1,
        hidden_size=32,
        intermediate_size=64,
    )


def speculative_config(proposer: str, target, draft_small) -> dict:
    if proposer == "ngram":
        return {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    draft = target if proposer == "draft-self" else draft_small
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3}


@st.composite
def workloads(draw):
    motif = draw(st.lists(st.integers(3, 300), min_size=3, max_size=6))
    shared = draw(st.lists(st.integers(3, 300), min_size=16, max_size=40))
    specs = []
    for _ in range(draw(st.integers(4, 7))):
        prefix = shared[: draw(st.sampled_from([0, 0, 16, len(shared)]))]
        tail = draw(st.lists(st.integers(3, 300), min_size=1, max_size=40))
        if draw(st.booleans()):  # repetitive text: n-gram lookup finds drafts
            tail = tail[:8] + motif * draw(st.integers(2, 6))
        greedy = draw(st.booleans())
        max_tokens = draw(st.integers(1, 24))
        params = SamplingParams(
            temperature=0.0 if greedy else draw(st.sampled_from([0.6, 1.0])),
            top_p=draw(st.sampled_from([1.0, 0.9])),
            seed=draw(st.one_of(st.none(), st.integers(0, 2**31))),
            max_tokens=max_tokens,
            stop_token_ids=draw(
                st.one_of(st.none(), st.lists(st.integers(3, 300), min_size=1, max_size=2))
            ),
            stop=draw(st.one_of(st.none(), st.sampled_from(["a", "e ", "xy"]))),
            logprobs=draw(st.sampled_from([None, None, 2])),
            presence_penalty=draw(st.sampled_from([0.0, 0.0, 0.5])),
            min_tokens=min(max_tokens, draw(st.sampled_from([0, 0, 3]))),
            ignore_eos=draw(st.booleans()),
        )
        abort_after = draw(st.one_of(st.none(), st.none(), st.integers(1, 8)))
        specs.append(Spec(prefix + tail, params, draw(st.integers(0, 8)), abort_after))
    return specs


def run(engine: LLMEngine, specs: list[Spec]) -> dict[str, tuple]:
    """Drive the engine step by step: add requests on arrival, abort after k tokens.

    A request that reached k tokens reports its first k (with speculation several
    tokens arrive per step, so it may have finished, or be aborted later in tokens,
    than without)."""
    results: dict[str, tuple] = {}
    pending = sorted(range(len(specs)), key=lambda i: specs[i].arrival)
    step = 0
    try:
        while pending or engine.has_unfinished_requests():
            while pending and specs[pending[0]].arrival <= step:
                i = pending.pop(0)
                engine.add_request(f"r{i}", {"prompt_token_ids": specs[i].prompt}, specs[i].params)
            for out in engine.step():
                k = specs[int(out.request_id[1:])].abort_after
                c = out.outputs[0]
                if k is not None and len(c.token_ids) >= k:
                    if not out.finished:
                        engine.abort_request(out.request_id)
                    results[out.request_id] = ("reached k", tuple(c.token_ids[:k]))
                else:
                    results[out.request_id] = snapshot(c)
            step += 1
            assert step < 2000, "workload did not finish"
    finally:  # a failing example must not leave requests behind for the next one
        engine.abort_request(list(engine._tracked))
    return results


def snapshot(c) -> tuple:
    logprobs = None
    if c.logprobs is not None:
        logprobs = [
            sorted((t, round(lp.logprob, 9), lp.rank) for t, lp in d.items()) for d in c.logprobs
        ]
    return (tuple(c.token_ids), c.text, c.finish_reason, c.stop_reason, logprobs)


class OracleProposer:
    """A test proposer that knows each request's outputs (from the run without
    speculation) and drafts them with every `corrupt_every`-th draft wrong, so steps
    accept every possible number of drafts (0..k) under batch churn (with k = 3 drafts per
    request-step, every 4th draft wrong lands on every position in turn)."""

    def __init__(self, corrupt_every: int = 4) -> None:
        self.expected: dict[str, tuple[int, ...]] = {}
        self.corrupt_every = corrupt_every
        self.calls = 0

    def propose(self, runner, inputs, wanted: dict[int, int], hidden=None) -> dict[int, list[int]]:
        drafts = {}
        for row, k in wanted.items():
            state = runner.batch.states[row]
            done = len(state.output_token_ids)
            future = list(self.expected.get(state.req_id, ())[done : done + k])
            for j in range(len(future)):
                self.calls += 1
                if self.calls % self.corrupt_every == 0:
                    future[j] = (future[j] + 1) % 300 + 3
            drafts[row] = future
        return drafts


def spec_engine(
    path, spec: dict | None, async_scheduling: bool, oracle: bool, **settings
) -> LLMEngine:
    """A float64 engine with speculation `spec` (an `OracleProposer` drafting instead of
    its proposer when `oracle`), sync inline or async on a thread."""
    engine = LLMEngine(
        EngineConfig(
            model=str(path),
            dtype="float64",
            async_scheduling=async_scheduling,
            executor_backend="thread" if async_scheduling else "inline",
            speculative_config=spec,
            **settings,
        )
    )
    if oracle:
        engine.core.executor.runner.proposer = OracleProposer()
    return engine


class Engines:
    """Engines built on first use (a hypothesis run touches a few dozen combinations)."""

    def __init__(self, targets: dict, draft_small) -> None:
        self.targets, self.draft_small = targets, draft_small
        self.made: dict[tuple, LLMEngine] = {}

    def get(
        self, setting: str, proposer: str | None, async_scheduling: bool, target: str = "llama"
    ) -> LLMEngine:
        key = (target, setting, proposer, async_scheduling)
        if key not in self.made:
            path = self.targets[target]
            spec = None
            if proposer == "oracle":
                spec = {"method": "ngram", "num_speculative_tokens": 3}
            elif proposer == "mtp":  # the target's own MTP layers (tests/test_spec_mtp.py)
                spec = {"method": "mtp", "num_speculative_tokens": 3}
            elif proposer is not None:
                spec = speculative_config(proposer, path, self.draft_small)
            self.made[key] = spec_engine(
                path, spec, async_scheduling, proposer == "oracle", **ENGINE_SETTINGS[setting]
            )
        return self.made[key]

    def close(self) -> None:
        for engine in self.made.values():
            engine.shutdown()


@pytest.fixture(scope="module")
def engines(tiny_llama_f64, tiny_qwen3_next, tiny_mamba2, draft_small):
    targets = {"llama": tiny_llama_f64, "qwen3_next": tiny_qwen3_next, "mamba2": tiny_mamba2}
    made = Engines(targets, draft_small)
    yield made
    made.close()


def check_equivalence(
    engines: Engines, specs, setting, proposer, async_scheduling, target: str = "llama"
) -> None:
    plain = engines.get(setting, None, False, target)
    spec = engines.get(setting, proposer, async_scheduling, target)
    # Unseeded requests draw their seeds from the engine's generator: start both alike.
    plain._seed_rng.seed(11)
    spec._seed_rng.seed(11)
    expected = run(plain, specs)
    proposer_obj = spec.core.executor.runner.proposer
    if isinstance(proposer_obj, OracleProposer):
        proposer_obj.expected = {
            f"r{i}": (out[1] if out[0] == "reached k" else out[0]) for i, out in _by_index(expected)
        }
    got = run(spec, specs)
    assert got == expected
    assert_nothing_held(plain)
    assert_nothing_held(spec)


def _by_index(results: dict[str, tuple]):
    return [(int(req_id[1:]), out) for req_id, out in results.items()]


EXAMPLE_SETTINGS = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@settings(max_examples=50, **EXAMPLE_SETTINGS)
@given(
    specs=workloads(),
    setting=st.sampled_from(sorted(ENGINE_SETTINGS)),
    proposer=st.sampled_from(PROPOSERS),
    async_scheduling=st.booleans(),
)
def test_speculation_gives_the_outputs_of_no_speculation(
    engines, specs, setting, proposer, async_scheduling
):
    check_equivalence(engines, specs, setting, proposer, async_scheduling)


@settings(max_examples=30, **EXAMPLE_SETTINGS)
@given(
    specs=workloads(),
    setting=st.sampled_from(sorted(ENGINE_SETTINGS)),
    proposer=st.sampled_from(("oracle", "oracle", "ngram", "draft-small")),
    async_scheduling=st.booleans(),
    target=st.sampled_from(("qwen3_next", "mamba2")),
)
def test_speculation_on_hybrid_recurrent_models(
    engines, specs, setting, proposer, async_scheduling, target
):
    """Gated delta-net + attention (Qwen3-Next) and Mamba2: a verifying request continues
    from the recurrent state of its last accepted position, whatever rows moved."""
    check_equivalence(engines, specs, setting, proposer, async_scheduling, target)


@pytest.mark.soak
@settings(max_examples=300, **EXAMPLE_SETTINGS)
@given(
    specs=workloads(),
    setting=st.sampled_from(sorted(ENGINE_SETTINGS)),
    proposer=st.sampled_from(("oracle", "ngram", "draft-small")),
    async_scheduling=st.booleans(),
    target=st.sampled_from(("qwen3_next", "mamba2")),
)
def test_speculation_soak_on_hybrid_models(
    engines, specs, setting, proposer, async_scheduling, target
):
    check_equivalence(engines, specs, setting, proposer, async_scheduling, target)


@pytest.mark.soak
@settings(max_examples=500, **EXAMPLE_SETTINGS)
@given(
    specs=workloads(),
    setting=st.sampled_from(sorted(ENGINE_SETTINGS)),
    proposer=st.sampled_from(PROPOSERS),
    async_scheduling=st.booleans(),
)
def test_speculation_soak(engines, specs, setting, proposer, async_scheduling):
    check_equivalence(engines, specs, setting, proposer, async_scheduling)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_drafts_are_accepted_and_counted(engines, async_scheduling):
    """The target as its own draft: every greedy draft is accepted, several tokens per step,
    and the counters say so (per request and engine-wide)."""
    engine = engines.get("roomy", "draft-self", async_scheduling)
    before = engine.core.scheduler.spec_stats.copy()
    steps = 0
    for i in range(3):
        engine.add_request(
            f"a{i}",
            {"prompt_token_ids": list(range(20 + i, 40 + i))},
            SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
        )
    finished = []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
        steps += 1
    assert len(finished) == 3
    for out in finished:
        c = out.outputs[0]
        assert len(c.token_ids) == 30
        assert c.num_draft_tokens > 0 and c.num_accepted_tokens == c.num_draft_tokens
    stats = engine.core.scheduler.spec_stats
    accepted = stats.num_accepted_tokens - before.num_accepted_tokens
    assert accepted == sum(o.outputs[0].num_accepted_tokens for o in finished)
    # 3 drafts + the bonus token per verifying step, nearly always
    assert 1 + accepted / (stats.num_verifying_steps - before.num_verifying_steps) > 3.0
    assert steps < 20  # 30 tokens each at ~4 per step (plus the prefill and the pipeline)
    assert_nothing_held(engine)


def test_ngram_drafts_come_from_the_history(engines):
    """The lookup continues the latest earlier occurrence of the longest matching suffix;
    on a long greedy run of a random model some drafts are verified and outputs equal
    the plain run's."""
    engine = engines.get("roomy", "ngram", False)
    proposer = engine.core.executor.runner.proposer
    assert proposer.lookup(np.array([11, 12, 13, 14, 15] * 3), 3) == [11, 12, 13]
    assert proposer.lookup(np.array([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3]), 2) == [7, 1]
    assert proposer.lookup(np.array([1, 2, 3, 4]), 3) == []
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    specs = [Spec(list(range(20, 40)), params, 0, None)]
    check_equivalence(engines, specs, "roomy", "ngram", False)
    assert engine.core.scheduler.spec_stats.num_draft_tokens > 0


@pytest.mark.parametrize(
    ("target", "proposers"),
    [("llama", ("draft-self", "ngram")), ("qwen3_next", ("oracle",)), ("mamba2", ("oracle",))],
)
def test_regression_seed_004_state_follows_its_request_when_rows_move(engines, target, proposers):
    """Source 004: a request going from prefill to its first speculative steps while other
    rows are removed and compacted must verify its own drafts at its own positions and,
    on a hybrid model, continue from its own recurrent state. Three requests finish at once
    while a fourth is mid-prefill; the batch is condensed (the fourth moves to row 0) as it
    starts speculating. Outputs equal no speculation, sync and async."""
    specs = [
        Spec(list(range(30 + i, 40 + i)), SamplingParams(temperature=0, max_tokens=3), 0, None)
        for i in range(3)
    ]
    long_prompt = list(range(100, 150)) + [7, 8, 9] * 5
    specs.append(
        Spec(long_prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), 1, None)
    )
    for async_scheduling in (False, True):
        for proposer in proposers:
            engine = engines.get("chunked", proposer, async_scheduling, target)
            plain = engines.get("chunked", None, False, target)
            moved = []
            batch = engine.core.executor.runner.batch
            original = batch._move_row

            def recording(src, dst, original=original, moved=moved):
                moved.append((src, dst))
                original(src, dst)

            batch._move_row = recording
            spec_states, plain_states = record_states(engine, "r3"), record_states(plain, "r3")
            try:
                check_equivalence(engines, specs, "chunked", proposer, async_scheduling, target)
            finally:
                del batch._move_row
                del engine.core.executor.runner.execute_model
                del plain.core.executor.runner.execute_model
            assert moved  # rows really were compacted under the speculating request
            if proposer != "ngram":  # a random model rarely repeats itself
                assert engine.core.scheduler.spec_stats.num_accepted_tokens > 0
            if target != "llama":  # the restored recurrent state is the no-spec state
                common = sorted(set(spec_states) & set(plain_states))
                assert [c for c in common if c > len(long_prompt) + 1]
                for computed in common:
                    for got, want in zip(
                        spec_states[computed], plain_states[computed], strict=True
                    ):
                        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def record_states(engine: LLMEngine, req_id: str) -> dict[int, list[torch.Tensor]]:
    """After each step: the recurrent state of `req_id`'s slot, by its computed tokens."""
    runner = engine.core.executor.runner
    seen: dict[int, list[torch.Tensor]] = {}
    original = runner.execute_model

    def recording(scheduler_output):
        out = original(scheduler_output)
        state = runner.requests.get(req_id)
        if state is not None and runner.recurrent_states is not None:
            slot = runner.recurrent.slot_of(req_id)
            seen[state.num_computed_tokens] = [
                t[slot].clone() for layer in runner.recurrent_states for t in layer.tensors
            ]
        return out

    runner.execute_model = recording
    return seen


def test_random_sampling_keeps_the_target_distribution(tmp_path_factory):
    """Chi-square: the first three tokens' distribution with a small-vocabulary model is
    the same with and without speculation (independent seeds on each side), and seeded
    requests reproduce exactly."""
    path = make_checkpoint(
        tmp_path_factory.mktemp("tiny-vocab"), "llama", seed=3, dtype=torch.float64, vocab_size=6
    )
    prompt = {"prompt_token_ids": [3, 4, 5, 3]}
    plain = LLM(str(path), dtype="float64", async_scheduling=False)
    spec = LLM(
        str(path),
        dtype="float64",
        async_scheduling=False,
        speculative_config={
            "method": "draft_model",
            "model": str(path),
            "num_speculative_tokens": 2,
        },
    )
    samples = 600

    def draws(llm, first_seed):
        params = [
            SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True, seed=first_seed + i)
            for i in range(samples)
        ]
        return [
            tuple(o.outputs[0].token_ids)
            for o in llm.generate([prompt] * samples, params, use_tqdm=False)
        ]

    with_spec = draws(spec, 0)
    assert draws(spec, 0) == with_spec  # seeded requests reproduce
    without = draws(plain, 10_000)
    assert draws(plain, 0) == with_spec  # same seeds: the very same tokens
    # Second and third tokens come from verified positions: test their joint law.
    observed = [[t[1:] for t in with_spec], [t[1:] for t in without]]
    p_value = chi_square_homogeneity(observed)
    assert p_value > 1e-3, p_value
    assert spec.engine.core.scheduler.spec_stats.num_accepted_tokens > 0


def chi_square_homogeneity(groups: list[list[tuple]]) -> float:
    """p-value of the chi-square test that the groups come from one distribution
    (categories seen fewer than 5 times in all pooled into one)."""
    from collections import Counter

    counts = [Counter(g) for g in groups]
    pooled = Counter()
    for c in counts:
        pooled.update(c)
    cats = [k for k, v in pooled.items() if v >= 5]
    rare = [k for k in pooled if k not in cats]
    table = [[c[k] for k in cats] + [sum(c[k] for k in rare)] for c in counts]
    if not rare:
        table = [row[:-1] for row in table]
    totals = [sum(row) for row in table]
    col = [sum(row[j] for row in table) for j in range(len(table[0]))]
    grand = sum(totals)
    stat = sum(
        (table[i][j] - totals[i] * col[j] / grand) ** 2 / (totals[i] * col[j] / grand)
        for i in range(len(table))
        for j in range(len(col))
        if col[j]
    )
    df = (len(table) - 1) * (len(col) - 1)
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0)))


def test_bad_speculative_config_names_the_field():
    with pytest.raises(ValueError, match="speculative_config.method"):
        EngineConfig(speculative_config={"method": "eagle9", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 0})
    with pytest.raises(ValueError, match="speculative_config.model"):
        EngineConfig(speculative_config={"method": "draft_model", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="unknown field"):
        EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 2, "x": 1})
    with pytest.raises(ValueError, match="not valid JSON"):
        EngineConfig(speculative_config="{method")
    assert SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 2}').method == (
        "ngram"
    )


def test_mtp_on_a_model_without_mtp_layers_is_refused(tiny_llama_f64):
    with pytest.raises(ValueError, match="mtp"):
        LLM(
            str(tiny_llama_f64),
            dtype="float64",
            async_scheduling=False,
            speculative_config={"method": "mtp", "num_speculative_tokens": 1},
        )
