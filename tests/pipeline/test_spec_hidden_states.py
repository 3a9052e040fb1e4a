"""A thinker that speculates still sends its talker exactly one hidden row per position it
fed (issue 22's soak runs demo-omni in the `spec` mode).

A verify pass computes the hidden states of every draft position; a rejected draft's row
is garbage and is computed again in a later step. The runner keeps a request's first
`kept` rows (`ModelRunner._add_hidden_states`), so the thinker -> talker payload of the
speculating thinker equals the plain one: tokens exactly, hidden rows of the same shape
to float64 rounding (a verify pass multiplies a few rows at once), and the talker's
codes and the audio exactly. Sync and async, payload and stream edges (a stream's chunks
may be cut elsewhere: the rows they add up to are the same).
"""

from __future__ import annotations

import pytest
import torch

from omnistage.testing.tiny_pipeline import tiny_pipeline_deploy
from tests.pipeline.pipeline_runs import run_pipeline
from tests.pipeline.test_async_stop_payloads import assert_same_payload, edge_payload

PROMPTS = ["abcabcabcabc", "hello hello hello", "the quick brown fox", "x" * 30, "omni omni"]
SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}


def _deploy(model, transfer: str, async_scheduling: bool, speculate: bool) -> dict:
    mode = {"async_scheduling": True, "executor_backend": "thread"} if async_scheduling else {}
    deploy = tiny_pipeline_deploy(model, thinker_transfer=transfer, thinker_tokens=24, **mode)
    if speculate:  # the talker samples extra codes per token: it takes no drafts
        thinker = deploy["stages"][0]
        thinker["engine_args"] = {**thinker["engine_args"], "speculative_config": SPECULATIVE}
    return deploy


@pytest.mark.parametrize("transfer", ["payload", "stream"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_speculating_thinker_sends_the_plain_payload(tiny_omni, transfer, async_scheduling):
    plain, spec = (
        run_pipeline(_deploy(tiny_omni, transfer, async_scheduling, speculate), PROMPTS)
        for speculate in (False, True)
    )
    stats = spec.cores["thinker"].scheduler.spec_stats
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens > 0
    assert stats.num_accepted_tokens < stats.num_draft_tokens  # rejected rows were dropped
    assert spec.outputs == plain.outputs  # tokens, finish reasons, audio bytes
    if transfer == "payload":
        assert spec.received.keys() == plain.received.keys()
        for key, payload in plain.received.items():
            assert_same_payload(spec.received[key], payload, key)
    for i, (ids, _, _) in enumerate(plain.outputs):
        # A stream's chunks are cut where the tokens came (a verify step may confirm
        # several): what they add up to is the same.
        joined, expected = edge_payload(spec, i), edge_payload(plain, i)
        assert torch.equal(joined["ids.prompt"], expected["ids.prompt"])
        assert joined["ids.output"].tolist() == expected["ids.output"].tolist() == ids, i
        assert joined["hidden"].shape == expected["hidden"].shape, i
        torch.testing.assert_close(joined["hidden"], expected["hidden"], rtol=0, atol=1e-12)
        assert joined["hidden"].shape[0] == joined["ids.prompt"].numel() + len(ids) - 1, i
    assert all(v == 0 for c in spec.counters.values() for v in c.values()), spec.counters
