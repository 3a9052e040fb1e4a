"""An AR stage emits each step's output once, as a delta: only stages whose output is text
detokenize (a talker's codec tokens are never decoded), stop strings apply only there, and
streamed text is never taken back when a stop string completes over several steps."""

from __future__ import annotations

import asyncio

import pytest

from omnistage.pipeline import ar_engine
from omnistage.pipeline.omni import AsyncOmni, Omni
from omnistage.sampling_params import SamplingParams
from omnistage.testing.tiny_pipeline import tiny_pipeline_deploy


def test_only_the_stage_that_writes_text_detokenizes(tiny_omni, monkeypatch):
    made: list[int] = []

    class Counting(ar_engine.IncrementalDetokenizer):
        def __init__(self, *args, **kwargs):
            made.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(ar_engine, "IncrementalDetokenizer", Counting)
    with Omni(tiny_pipeline_deploy(tiny_omni), in_process=True) as omni:
        thinker = omni.orchestrator.clients["thinker"].core.engine
        talker = omni.orchestrator.clients["talker"].core.engine
        assert thinker.writes_text and not talker.writes_text
        talker_outputs = []
        step = talker.step

        def recording():
            outputs = step()
            talker_outputs.extend(outputs)
            return outputs

        talker.step = recording
        outs = omni.generate(["one", "two", "three"])
        assert all(o.error is None and o.text and o.audio is not None for o in outs)
    assert len(made) == 3  # one per request, on the thinker only
    assert sum(len(o.new_token_ids) for o in talker_outputs) == 3 * 20
    assert all(o.new_text == "" for o in talker_outputs)


def test_stop_strings_on_a_stage_without_text_are_refused_up_front(tiny_omni):
    with Omni(tiny_pipeline_deploy(tiny_omni), in_process=True) as omni:
        with pytest.raises(ValueError, match=r"^sampling_params\['talker'\]\.stop: .*no text"):
            omni.generate(["x"], {"talker": SamplingParams(stop=["a"])})
        assert omni.generate(["x"], {"thinker": SamplingParams(stop=["a"])})[0].error is None


def test_streamed_text_is_never_taken_back_by_a_stop_string(tiny_omni):
    """A 3-character stop string completes over three steps (a byte-level tokenizer): the
    text before it is streamed, its start held back, and the pieces add up to the final
    text (sending the cut text again would duplicate it)."""
    omni = AsyncOmni(tiny_pipeline_deploy(tiny_omni), in_process=True)

    def run(stop: list[str]):
        async def collect():
            params = {"thinker": SamplingParams(temperature=0.0, max_tokens=12, stop=stop)}
            return [u async for u in omni.generate("stop me", params, ["text"])]

        return asyncio.run(collect())

    try:
        whole = run([])[-1].text
        start = next(i for i in range(1, len(whole) - 3) if "\ufffd" not in whole[i : i + 3])
        stop = whole[start : start + 3]
        updates = run([stop])
    finally:
        omni.shutdown()
    final = updates[-1]
    assert final.error is None and final.text == whole[: whole.find(stop)]
    assert "".join(u.new_text for u in updates) == final.text
    assert sum((u.new_token_ids for u in updates), []) == final.token_ids
    assert final.outputs["thinker"].finish_reason == "stop"
