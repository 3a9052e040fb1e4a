"""Bagel end to end on the tiny float64 checkpoint: understanding stage (our AR engine) ->
prompt KV hand-off (shared-memory connector) -> draw stage.

Exactness, not closeness: the image bytes are identical for sync vs async scheduling of the
understanding stage, with and without guidance, alone vs batched with other requests; the
KV rows handed off are bit-identical between sync and async even when the stage decodes
past the prompt (a step scheduled ahead must not add or change a row); and the picture is
the one `BagelImageModel` draws alone from the same seed (its own prefill, positions
0..n-1, image tokens at n): the hand-off carries the prompt's KV and the draw stage places
the image right after it (seeds/002).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.diffusion.params import DiffusionParams
from omnistage.families.bagel.edges import BagelPromptKV
from omnistage.families.bagel.text_to_image import BagelImageModel
from omnistage.families.bagel.tiny import make_demo_bagel
from omnistage.pipeline.omni import Omni

PROMPTS = ["a red cube on a blue floor", "two cats", "a very long prompt about a lighthouse"]
SIZE, STEPS, SEED = 16, 3, 11


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_demo_bagel(tmp_path_factory.mktemp("demo-bagel"), 0)


def _draw(guidance: float) -> DiffusionParams:
    return DiffusionParams(
        height=SIZE, width=SIZE, num_inference_steps=STEPS, guidance_scale=guidance, seed=SEED
    )


def _session(ckpt, async_scheduling: bool) -> dict:
    """One Omni session of every run the tests compare: the target alone and batched,
    without and with guidance, and the KV rows handed off at max_tokens 1 and 4."""
    out: dict = {}
    handed: dict[int, torch.Tensor] = {}
    original = BagelPromptKV.to_diffusion_input

    def recording(self, payload):
        handed[int(payload["ids.prompt"].shape[0])] = payload["hidden_states.output"].clone()
        return original(self, payload)

    def run(prompts, guidance, max_tokens=1):
        understanding = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outs = omni.generate(prompts, {"understanding": understanding, "draw": _draw(guidance)})
        assert all(o.error is None for o in outs)
        return [o.image_array for o in outs]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BagelPromptKV, "to_diffusion_input", recording)
        with Omni(
            model=str(ckpt), in_process=True, dtype="float64", async_scheduling=async_scheduling
        ) as omni:
            for guidance in (1.0, 3.0):
                out["alone", guidance] = run(PROMPTS[:1], guidance)[0]
                handed.clear()
                batched = run([PROMPTS[1], PROMPTS[0], PROMPTS[2]], guidance)
                out["batched", guidance] = batched
                out["kv", 1] = dict(handed)
            handed.clear()
            run(PROMPTS, 3.0, max_tokens=4)
            out["kv", 4] = dict(handed)
            handed.clear()
            stop = SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=[STOP[1]])
            omni.generate(PROMPTS[:1], {"understanding": stop, "draw": _draw(3.0)})
            out["kv", "stop"] = dict(handed)
            assert all(not any(c.values()) for c in omni.stage_counters().values())
    return out


def _greedy(model: BagelImageModel, prompt: str, count: int) -> list[int]:
    """The understanding expert's greedy continuation of `prompt` (the MoT alone)."""
    lm = model.language_model
    ids = torch.tensor(model.prompt_ids(prompt))
    hidden, context = lm.prefill(ids, lm.empty_context())
    out = []
    for _ in range(count):
        out.append(int(lm.compute_logits(hidden[-1:]).argmax()))
        hidden, context = lm.prefill(torch.tensor(out[-1:]), context)
    return out


STOP: tuple[int, int] = (0, 0)
"""(index, id) of the first greedy token of PROMPTS[0] after the first two that is new."""


@pytest.fixture(scope="module")
def runs(ckpt):
    global STOP
    tokens = _greedy(BagelImageModel(ckpt / "bagel", torch.float64), PROMPTS[0], 8)
    STOP = next((i, t) for i, t in enumerate(tokens) if i >= 2 and t not in tokens[:i])
    return {mode: _session(ckpt, mode) for mode in (False, True)}


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_sync_async_alone_batched_identical_and_equal_to_the_model_alone(ckpt, runs, guidance):
    target = PROMPTS[0]
    reference = runs[False]["alone", guidance]
    assert reference.shape == (SIZE, SIZE, 3) and reference.std() > 0
    for mode in (False, True):
        assert np.array_equal(runs[mode]["alone", guidance], reference)
        assert np.array_equal(runs[mode]["batched", guidance][1], reference)
    model = BagelImageModel(ckpt / "bagel", torch.float64)
    block = model.generator.block(SIZE, SIZE)
    noise = torch.randn((1, block.h, block.w, 16), generator=torch.Generator().manual_seed(SEED))
    _, alone = model.generate(
        target, SIZE, SIZE, STEPS, noise.reshape(block.num_tokens, 16), text_scale=guidance
    )
    assert np.array_equal(alone.numpy(), reference)


def test_guidance_and_prompt_change_the_image(runs):
    plain, guided = runs[False]["batched", 1.0], runs[False]["batched", 3.0]
    assert not np.array_equal(plain[0], plain[1])
    assert not np.array_equal(plain[1], guided[1])


def test_a_step_scheduled_ahead_never_reaches_the_handed_off_kv(runs):
    """The stage stops at a stop token it could not know of in advance: async scheduling
    has already scheduled (and run) the step after it, and none of that step's KV may
    reach the payload: the rows are exactly sync's, one per position before the stop."""
    sync, asyn = runs[False]["kv", "stop"], runs[True]["kv", "stop"]
    ((n, rows),) = sync.items()
    assert rows.shape[0] == n + STOP[0]
    assert torch.equal(rows, asyn[n])


@pytest.mark.parametrize("max_tokens", [1, 4])
def test_handed_off_kv_is_exactly_syncs(ckpt, runs, max_tokens):
    """The payload's KV rows under async equal sync's bit for bit, one row per position the
    stage computed (prompt + max_tokens - 1: the last token is sampled, never computed);
    the prompt's rows equal the MoT's own prefill of the prompt."""
    sync, asyn = runs[False]["kv", max_tokens], runs[True]["kv", max_tokens]
    assert sorted(sync) == sorted(asyn) and len(sync) == len(PROMPTS)
    for n, rows in sync.items():
        assert rows.shape[0] == n + max_tokens - 1
        assert torch.equal(rows, asyn[n])
    model = BagelImageModel(ckpt / "bagel", torch.float64)
    for prompt in PROMPTS:
        ids = model.prompt_ids(prompt)
        context = model.contexts(prompt, guidance=False).full
        torch.testing.assert_close(
            sync[len(ids)][: len(ids)], context.to_rows(), rtol=0, atol=1e-12
        )
        assert context.rope == len(ids)


def test_bagel_folder_served_through_its_view_and_bad_input_refused(
    ckpt, runs, tmp_path, monkeypatch
):
    """The checkpoint in Bagel's own layout (no config.json) picks the bagel deploy through
    its converted view and draws the same image; inputs it cannot serve are ValueErrors
    naming the field, before any stage runs."""
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path / "cache"))
    with Omni(model=str(ckpt / "bagel"), in_process=True, dtype="float64") as omni:
        assert [s.name for s in omni.deploy.stages] == ["understanding", "draw"]
        (out,) = omni.generate(PROMPTS[:1], {"draw": _draw(3.0)})
        assert np.array_equal(out.image_array, runs[False]["alone", 3.0])
        with pytest.raises(ValueError, match="height: 18"):
            omni.generate(["x"], {"draw": DiffusionParams(height=18, width=16)})
        with pytest.raises(ValueError, match="width: 64"):
            omni.generate(["x"], {"draw": DiffusionParams(height=16, width=64)})
        assert all(not any(c.values()) for c in omni.stage_counters().values())
