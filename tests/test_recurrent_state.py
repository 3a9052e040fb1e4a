"""Recurrent state slots (worker/recurrent.py) and the Mamba2 layer's use of them.

Slot bookkeeping, state allocation, `commit_accepted`, and on a float64 Mamba2
mixer driven with hand-built metadata: a prompt split into chunks (next to other
requests' decodes) gives the outputs and state of the whole prompt at once, a
slot's stale contents are ignored when a request starts at position 0, and a
speculative row of q tokens followed by `commit_accepted(a)` leaves exactly the
state of running only its first a + 1 tokens.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from omnistage.families.mamba2.mixer import Mamba2Mixer
from omnistage.layers.forward_context import forward_context
from omnistage.layers.recurrent_state import RecurrentMetadata
from omnistage.models.tiny_checkpoints import tiny_config
from omnistage.worker.recurrent import (
    RecurrentSlots,
    allocate_recurrent_state,
    commit_accepted,
)

F64 = torch.float64


def test_slots_are_keyed_by_request_and_return_when_released():
    slots = RecurrentSlots(3)
    assert [slots.add(r) for r in ("a", "b", "c")] == [0, 1, 2]
    assert slots.num_free == 0
    with pytest.raises(RuntimeError, match="no free"):
        slots.add("d")
    slots.remove("b")
    slots.remove("never-seen")  # ignored
    assert slots.add("d") == 1 and slots.slot_of("d") == 1
    with pytest.raises(RuntimeError, match="already holds"):
        slots.add("d")
    for r in ("a", "c", "d"):
        slots.remove(r)
    assert slots.num_free == 3 and slots.num_used == 0


def test_metadata_of_a_step():
    slots = RecurrentSlots(4)
    for r in ("x", "y", "z"):
        slots.add(r)
    meta = slots.metadata(["z", "x"], [5, 1], [0, 9], [0, 0], "cpu")
    assert meta.state_slots.tolist() == [2, 0]
    assert meta.query_start_loc == [0, 5, 6] and meta.query_lens == [5, 1]
    assert meta.has_initial_state.tolist() == [False, True]
    assert meta.has_initial_state_cpu == [False, True]
    assert meta.spec_lens == [0, 0] and meta.num_reqs == 2


def test_allocate_and_commit_accepted():
    states = allocate_recurrent_state([((2, 3), (4,)), ((5,),)], 4, F64, "cpu", spec_positions=3)
    assert [t.shape for t in states[0].tensors] == [(4, 2, 3), (4, 4)]
    assert [t.shape for t in states[0].scratch] == [(4, 3, 2, 3), (4, 3, 4)]
    assert allocate_recurrent_state([((5,),)], 2, F64, "cpu")[0].scratch is None
    for layer in states:
        for s in layer.scratch:
            s.copy_(torch.randn(s.shape, dtype=F64))
    before = [t.clone() for layer in states for t in layer.tensors]
    commit_accepted(states, torch.tensor([3, 1]), torch.tensor([2, 0]))
    after = [t for layer in states for t in layer.tensors]
    scratch = [s for layer in states for s in layer.scratch]
    for old, new, s in zip(before, after, scratch, strict=True):
        torch.testing.assert_close(new[3], s[3, 2], rtol=0, atol=0)
        torch.testing.assert_close(new[1], s[1, 0], rtol=0, atol=0)
        torch.testing.assert_close(new[[0, 2]], old[[0, 2]], rtol=0, atol=0)


# -- the Mamba2 layer ------------------------------------------------------------------------
NUM_SLOTS, SPEC = 4, 5


@pytest.fixture
def mixer():
    torch.manual_seed(0)
    layer = Mamba2Mixer(tiny_config("mamba2"), F64)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, dtype=F64) * 0.3)
    layer.state = allocate_recurrent_state(
        [layer.state_shapes()], NUM_SLOTS, F64, "cpu", spec_positions=SPEC
    )[0]
    return layer


def run(
    layer: Mamba2Mixer,
    x: torch.Tensor,
    slots: list[int],
    lens: list[int],
    initial: list[bool],
    spec: list[int] | None = None,
) -> torch.Tensor:
    loc = [0]
    for n in lens:
        loc.append(loc[-1] + n)
    meta = RecurrentMetadata(
        state_slots=torch.tensor(slots),
        query_start_loc=loc,
        query_lens=lens,
        has_initial_state=torch.tensor(initial),
        spec_lens=spec or [0] * len(lens),
    )
    with torch.no_grad(), forward_context(SimpleNamespace(recurrent=meta)):
        return layer(x)


def snapshot(layer: Mamba2Mixer, slot: int) -> list[torch.Tensor]:
    return [t[slot].clone() for t in layer.state.tensors]


def assert_states_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


def test_chunked_prompt_equals_the_whole_prompt(mixer):
    x = torch.randn(30, 64, dtype=F64)
    whole = run(mixer, x, [0], [30], [False])
    whole_state = snapshot(mixer, 0)
    mixer.state.tensors[1][2].fill_(float("nan"))  # stale contents of a reused slot: ignored
    other = torch.randn(4, 64, dtype=F64)
    run(mixer, other[:3], [1], [3], [False])
    parts, at = [], 0
    for n in [7, 1, 13, 9]:
        # each chunk shares its step with another request's decode
        step = torch.cat([other[3:4], x[at : at + n]])
        out = run(mixer, step, [1, 2], [1, n], [True, at > 0])
        parts.append(out[1:])
        at += n
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-10, atol=1e-10)
    assert_states_equal(snapshot(mixer, 2), whole_state)


def test_decodes_equal_the_prompt_run_at_once(mixer):
    x = torch.randn(6, 64, dtype=F64)
    whole = run(mixer, x, [0], [6], [False])
    steps = [run(mixer, x[i : i + 1], [3], [1], [i > 0]) for i in range(6)]
    torch.testing.assert_close(torch.cat(steps), whole, rtol=1e-10, atol=1e-10)
    assert_states_equal(snapshot(mixer, 3), snapshot(mixer, 0))


@pytest.mark.parametrize("accepted", range(SPEC))
def test_commit_accepted_gives_the_state_of_the_accepted_prefix(mixer, accepted):
    prompt, drafts = torch.randn(11, 64, dtype=F64), torch.randn(SPEC, 64, dtype=F64)
    slot = 2
    run(mixer, prompt, [slot], [11], [False])
    after_prompt = snapshot(mixer, slot)
    # the verification row, beside another request's prefill
    other = torch.randn(9, 64, dtype=F64)
    out = run(mixer, torch.cat([other, drafts]), [0, slot], [9, SPEC], [False, True], [0, SPEC])
    spec_out = out[9:]
    # reference: only the first accepted + 1 tokens, from the state after the prompt
    for t, saved in zip(mixer.state.tensors, after_prompt, strict=True):
        t[slot] = saved
    ref_out = run(mixer, drafts[: accepted + 1], [slot], [accepted + 1], [True])
    ref_state = snapshot(mixer, slot)
    torch.testing.assert_close(spec_out[: accepted + 1], ref_out, rtol=1e-10, atol=1e-10)
    assert_states_equal([s[slot, accepted] for s in mixer.state.scratch], ref_state)
    for t, saved in zip(mixer.state.tensors, after_prompt, strict=True):
        t[slot] = saved + 1  # whatever the main state holds, the commit replaces it
    commit_accepted([mixer.state], torch.tensor([slot]), torch.tensor([accepted]))
    assert_states_equal(snapshot(mixer, slot), ref_state)
