"""MTP speculation: drafts from the checkpoint's own multi-token-prediction layers.

Tiny float64 Qwen3-Next and Qwen3.5 checkpoints get random `mtp.*` weights
(testing/tiny_mtp.py). A small vocabulary (8 tokens) makes random drafts right
often enough that steps accept 0, 1 and more drafts, so the proposer's catch-up
on accepted positions is exercised.

1. Each step's first draft is what the MTP module computes: a reference runs
   transformers' target and a transformers decoder layer loaded with the `mtp.*`
   weights over the whole sequence (no paged cache).
2. Speculation (mtp) ≡ no speculation, token for token, greedy and seeded random,
   sync and async, with batch churn, chunked prefill and preemption (the harness of
   tests/test_spec_decode.py).
3. `method: mtp` on a checkpoint without MTP weights is refused.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omnistage import LLM, SamplingParams
from omnistage.models.tiny_checkpoints import make_checkpoint
from omnistage.testing.tiny_mtp import make_mtp_checkpoint
from tests.test_spec_decode import (
    ENGINE_SETTINGS,
    EXAMPLE_SETTINGS,
    Engines,
    Spec,
    assert_nothing_held,
    check_equivalence,
    workloads,
)

VOCAB = 8
ARCHES = ("qwen3_next", "qwen3_5")


@pytest.fixture(scope="module")
def mtp_checkpoints(tmp_path_factory):
    return {
        arch: make_mtp_checkpoint(
            tmp_path_factory.mktemp(f"mtp-{arch}"), arch, seed=2, vocab_size=VOCAB
        )
        for arch in ARCHES
    }


@pytest.fixture(scope="module")
def engines(mtp_checkpoints):
    made = Engines(mtp_checkpoints, draft_small=None)
    yield made
    made.close()


def small_vocab(specs):
    """The workload's token ids folded into the tiny vocabulary (3..7: byte tokens)."""
    fold = lambda ids: None if ids is None else [3 + t % (VOCAB - 3) for t in ids]  # noqa: E731
    return [
        dataclasses.replace(
            s,
            prompt=fold(s.prompt),
            params=dataclasses.replace(s.params, stop_token_ids=fold(s.params.stop_token_ids)),
        )
        for s in specs
    ]


# -- 1. the drafts are the MTP module's ---------------------------------------------------------
def reference_first_drafts(path, arch: str, histories: list[list[int]]) -> list[int]:
    """Per history `t_0..t_c`: argmax of the MTP over positions `p < c` (the target's final
    hidden state `h_p` with the embedding of `t_{p+1}`), at `p = c - 1`. Plain transformers
    modules over the whole sequence."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    if arch == "qwen3_next":
        from transformers.models.qwen3_next import modeling_qwen3_next as hf

        layer_cls, norm_cls, rotary_cls = (
            hf.Qwen3NextDecoderLayer,
            hf.Qwen3NextRMSNorm,
            hf.Qwen3NextRotaryEmbedding,
        )
    else:
        from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

        layer_cls, norm_cls, rotary_cls = (
            hf.Qwen3_5DecoderLayer,
            hf.Qwen3_5RMSNorm,
            hf.Qwen3_5TextRotaryEmbedding,
        )
    target = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float64, experts_implementation="eager"
    ).eval()
    config = copy.deepcopy(AutoConfig.from_pretrained(path))
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # grouped GEMMs refuse float64
    weights = {
        k[4:]: v for k, v in load_file(path / "model.safetensors").items() if k[:4] == "mtp."
    }
    layer = layer_cls(config, 0).to(torch.float64).eval()
    state = {k[len("layers.0.") :]: v for k, v in weights.items() if k.startswith("layers.0.")}
    experts = getattr(layer.mlp, "experts", None)
    if experts is not None and hasattr(experts, "gate_up_proj"):  # fused experts in transformers
        n = experts.gate_up_proj.shape[0]
        e = "mlp.experts"
        state[f"{e}.gate_up_proj"] = torch.stack(
            [
                torch.cat([state[f"{e}.{i}.gate_proj.weight"], state[f"{e}.{i}.up_proj.weight"]])
                for i in range(n)
            ]
        )
        state[f"{e}.down_proj"] = torch.stack(
            [state[f"{e}.{i}.down_proj.weight"] for i in range(n)]
        )
        state = {k: v for k, v in state.items() if not k.startswith(f"{e}.") or k.count(".") == 2}
    layer.load_state_dict(state)
    norms = {}
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        norms[name] = norm_cls(config.hidden_size, eps=config.rms_norm_eps).to(torch.float64)
        norms[name].load_state_dict({"weight": weights[f"{name}.weight"]})
    rotary = rotary_cls(config).to(torch.float64)
    drafts = []
    with torch.no_grad():
        for history in histories:
            ids = torch.tensor([history])
            c = len(history) - 1
            hidden = target.model(ids).last_hidden_state[:, :c]
            embeds = target.get_input_embeddings()(ids[:, 1:])
            x = torch.cat(
                [norms["pre_fc_norm_embedding"](embeds), norms["pre_fc_norm_hidden"](hidden)], -1
            )
            x = x @ weights["fc.weight"].T
            positions = torch.arange(c)[None]
            mask = torch.full((c, c), float("-inf"), dtype=torch.float64).triu(1)[None, None]
            x = layer(x, position_embeddings=rotary(x, positions), attention_mask=mask)
            logits = target.lm_head(norms["norm"](x))
            drafts.append(int(logits[0, -1].argmax()))
    return drafts


@pytest.mark.parametrize("arch", ARCHES)
def test_drafts_are_what_the_mtp_layer_computes(engines, mtp_checkpoints, arch):
    """Every step's first draft, for each request (chunked prefill, several requests, drafts
    partly accepted), equals the reference's."""
    engine = engines.get("chunked", "mtp", False, arch)
    runner = engine.core.executor.runner
    proposer = runner.proposer
    seen: list[tuple[list[int], int]] = []
    original = proposer.propose

    def recording(runner_, inputs, wanted, hidden):
        drafts = original(runner_, inputs, wanted, hidden)
        batch = runner_.batch
        for row, d in drafts.items():
            seen.append((batch.token_ids[row, : batch.num_tokens[row]].tolist(), d[0]))
        return drafts

    proposer.propose = recording
    try:
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        for i, prompt in enumerate(([3, 4, 5, 6, 7] * 6, [5, 3, 7, 4], [6, 6, 3, 5, 7, 4, 4] * 3)):
            engine.add_request(f"m{i}", {"prompt_token_ids": prompt}, params)
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        del proposer.propose
    assert_nothing_held(engine)
    assert len(seen) > 20
    assert engine.core.scheduler.spec_stats.num_accepted_tokens > 0
    histories = [h for h, _ in seen]
    assert [d for _, d in seen] == reference_first_drafts(mtp_checkpoints[arch], arch, histories)


# -- 2. speculation ≡ no speculation ------------------------------------------------------------
@settings(max_examples=40, **EXAMPLE_SETTINGS)
@given(
    specs=workloads(),
    setting=st.sampled_from(sorted(ENGINE_SETTINGS)),
    async_scheduling=st.booleans(),
    arch=st.sampled_from(ARCHES),
)
def test_mtp_speculation_gives_the_outputs_of_no_speculation(
    engines, specs, setting, async_scheduling, arch
):
    check_equivalence(engines, small_vocab(specs), setting, "mtp", async_scheduling, arch)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_mtp_under_preemption_and_random_sampling(engines, async_scheduling):
    """Requests arriving over time under the tiny KV budget (preempted and recomputed),
    seeded random and greedy, with a stop token and logprobs."""
    specs = [
        Spec(
            [3 + (7 * i + j) % 5 for j in range(30 + 5 * i)],
            SamplingParams(
                temperature=0.0 if i % 2 else 1.0,
                seed=None if i % 2 else 100 + i,
                max_tokens=24,
                ignore_eos=True,
                stop_token_ids=[7] if i == 3 else None,
                logprobs=2 if i == 2 else None,
            ),
            i // 2,
            None,
        )
        for i in range(5)
    ]
    for arch in ARCHES:
        spec = engines.get("preempting", "mtp", async_scheduling, arch)
        before = (
            spec.core.scheduler.num_preemptions,
            spec.core.scheduler.spec_stats.num_draft_tokens,
        )
        check_equivalence(engines, specs, "preempting", "mtp", async_scheduling, arch)
        assert spec.core.scheduler.num_preemptions > before[0]
        assert spec.core.scheduler.spec_stats.num_draft_tokens > before[1]


# -- 3. refusal ---------------------------------------------------------------------------------
def test_mtp_without_mtp_weights_is_refused(tiny_qwen3_next, tmp_path):
    """A hybrid checkpoint without `mtp.*` weights (its config silent about MTP layers, or
    declaring one): a clear ValueError naming the method; without speculation it loads."""
    declared = make_checkpoint(tmp_path, "qwen3_5", seed=1, mtp_num_hidden_layers=1)
    for path in (tiny_qwen3_next, declared):
        with pytest.raises(ValueError, match="mtp is not available"):
            LLM(
                str(path),
                dtype="float64",
                async_scheduling=False,
                speculative_config={"method": "mtp", "num_speculative_tokens": 2},
            )
    plain = LLM(str(declared), dtype="float64", async_scheduling=False)
    assert plain.engine.core.executor.runner.model.mtp is None
