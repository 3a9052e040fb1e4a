"""A producer that stops early under async scheduling sends exactly the sync payloads.

When the thinker stops at step N (its end-of-sequence token, a stop token, a stop
string), async scheduling has already scheduled and run step N+1 for it: the model
computed the stop token's position and sampled past it. Nothing of that step may reach
the talker (DESIGN.md invariant 6; the failure of seeds/002): what the talker receives
must equal the sync run's (exactly; hidden states to float64 rounding, see
`assert_same_payload`), its tokens are the thinker's confirmed tokens and it holds one
hidden row per position the thinker fed, none more. Float64 tiny models, greedy.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoTokenizer

from omnistage import SamplingParams
from omnistage.pipeline.accumulator import HIDDEN_KEY
from omnistage.testing.payload_equality import assert_same_payload
from omnistage.testing.tiny_pipeline import tiny_pipeline_deploy
from tests.pipeline.pipeline_runs import PipelineRun, run_pipeline

PROMPTS = ["hello world", "abc", "the quick brown fox jumps", "x" * 40, "omni", "stage by stage"]
MAX_TOKENS = 12
EDGE = "thinker->talker"


@pytest.fixture(scope="module")
def stop_token(tiny_omni) -> tuple[int, str]:
    """A token greedy decoding reaches after the first step in several prompts, before
    `MAX_TOKENS` (the others run to their length), and its text: one ASCII letter or
    digit, which only this token writes, so it also serves as a stop string."""
    run = run_pipeline(tiny_pipeline_deploy(tiny_omni, thinker_tokens=MAX_TOKENS), PROMPTS)
    tokenizer = AutoTokenizer.from_pretrained(tiny_omni / "thinker")
    stops: dict[int, int] = {}
    for ids, _, _ in run.outputs:
        for token in set(ids):
            text = tokenizer.decode([token])
            if 1 <= ids.index(token) < MAX_TOKENS - 1 and len(text) == 1 and text.isalnum():
                stops[token] = stops.get(token, 0) + 1
    token = max(sorted(stops), key=stops.__getitem__)
    assert stops[token] >= 2
    return token, tokenizer.decode([token])


@pytest.fixture(scope="module")
def eos_omni(tiny_omni, stop_token, tmp_path_factory):
    """The tiny checkpoint, but the thinker's end-of-sequence token is `stop_token`."""
    path = tmp_path_factory.mktemp("eos-omni") / "omni"
    shutil.copytree(tiny_omni, path)
    for name in ("config.json", "generation_config.json"):
        file = path / "thinker" / name
        config = json.loads(file.read_text())
        config["eos_token_id"] = stop_token[0]
        file.write_text(json.dumps(config))
    return path


def thinker_params(kind: str, stop_token: tuple[int, str]) -> SamplingParams:
    token, text = stop_token
    stops = {
        "eos": {"ignore_eos": False},
        "stop_token_ids": {"ignore_eos": True, "stop_token_ids": [token]},
        "stop": {"ignore_eos": True, "stop": [text]},
    }[kind]
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, **stops)


def edge_payload(run: PipelineRun, i: int) -> dict[str, torch.Tensor]:
    """Prompt `i`'s thinker->talker payload as the talker received it, stream chunks
    joined: its prompt ids, output ids and hidden rows."""
    chunks = [p for (j, edge, _), p in sorted(run.received.items()) if (j, edge) == (i, EDGE)]
    return {
        "ids.prompt": chunks[0]["ids.prompt"],
        "ids.output": torch.cat([c["ids.output"] for c in chunks]),
        "hidden": torch.cat([c[HIDDEN_KEY] for c in chunks]),
    }


@pytest.mark.parametrize(
    ("kind", "transfer"),
    [("eos", "payload"), ("eos", "stream"), ("stop_token_ids", "stream"), ("stop", "payload")],
)
def test_an_early_stop_under_async_sends_the_sync_payload(
    tiny_omni, eos_omni, stop_token, kind, transfer
):
    model = eos_omni if kind == "eos" else tiny_omni
    params = {"thinker": thinker_params(kind, stop_token)}
    runs = [
        run_pipeline(
            tiny_pipeline_deploy(model, thinker_transfer=transfer, **mode), PROMPTS, params
        )
        for mode in ({}, {"async_scheduling": True, "executor_backend": "thread"})
    ]
    sync, async_ = runs
    stopped = [i for i, (ids, reason, _) in enumerate(sync.outputs) if reason == "stop"]
    assert len(stopped) >= 2  # the thinker really stopped early, not at its length
    assert all(sync.outputs[i][0][-1] == stop_token[0] for i in stopped)
    assert len(stopped) < len(PROMPTS)  # ... while others ran on beside them
    # Under async, a step was scheduled ahead of each stop and its results came after it.
    assert async_.probes["thinker"].results_for_ended_requests >= len(stopped)
    assert sync.probes["thinker"].results_for_ended_requests == 0
    for i, (ids, _, _) in enumerate(sync.outputs):
        for run in runs:
            # Only confirmed data: the tokens the thinker produced (as sync reports them), a
            # hidden row per position it fed (the prompt and every output but the last),
            # nothing of the step scheduled ahead.
            payload = edge_payload(run, i)
            assert payload["ids.output"].tolist() == ids, i
            assert payload["hidden"].shape[0] == payload["ids.prompt"].numel() + len(ids) - 1, i
    assert async_.received.keys() == sync.received.keys()
    for key, payload in sync.received.items():
        assert_same_payload(async_.received[key], payload, key)
    assert async_.outputs == sync.outputs
    for run in runs:
        assert all(v == 0 for c in run.counters.values() for v in c.values()), run.counters
