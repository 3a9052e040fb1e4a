"""The pipeline runtime in-process: equivalences, routing, bad requests, counters.

Float64 tiny models, greedy: every comparison here is exact.
"""

from __future__ import annotations

import pytest
import torch

from omnistage import SamplingParams
from omnistage.core.payload import pack_payload
from omnistage.pipeline.omni import Omni
from omnistage.testing.payload_equality import assert_same_payload
from omnistage.testing.tiny_pipeline import tiny_pipeline_deploy

PROMPTS = ["hello world", "abc", "the quick brown fox jumps", "x" * 40, "omni", "stage by stage"]


def run(tiny_omni, prompts=PROMPTS, record_payloads=False, **deploy_args):
    """Outputs (text ids, audio) per prompt, and optionally every payload put, as bytes."""
    recorded: dict[tuple[int, str, int], bytes] = {}
    with Omni(tiny_pipeline_deploy(tiny_omni, **deploy_args), in_process=True) as omni:
        if record_payloads:
            _record_puts(omni, recorded)
        outputs = omni.generate(prompts)
        counters = omni.stage_counters()
    index = {o.request_id: i for i, o in enumerate(outputs)}
    payloads = {(index[rid], edge, chunk): data for (rid, edge, chunk), data in recorded.items()}
    for o in outputs:
        assert o.error is None, o.error
    return [(o.token_ids, o.audio) for o in outputs], payloads, counters


def _record_puts(omni, recorded):
    for client in omni.orchestrator.clients.values():
        for connector in client.core.connectors.values():
            put = connector.put

            def recording_put(key, payload, put=put):
                rid, edge, chunk = key.rsplit("/", 2) if key.count("/") >= 2 else (key, "", 0)
                # Byte-exact, but for the request id (random per run).
                same = {k: v for k, v in payload.items() if k != "meta.request_id"}
                recorded[(rid, edge, int(chunk))] = pack_payload(same)
                return put(key, payload)

            connector.put = recording_put


def assert_same(a, b):
    assert len(a) == len(b)
    for (ids_a, audio_a), (ids_b, audio_b) in zip(a, b, strict=True):
        assert ids_a == ids_b
        assert audio_a.dtype == audio_b.dtype and audio_a.shape == audio_b.shape
        assert (audio_a == audio_b).all()


@pytest.fixture(scope="module")
def omni(tiny_omni):
    """The default deploy, started once for the tests that only send it requests (greedy:
    a request's outputs do not depend on what the pipeline ran before)."""
    with Omni(tiny_pipeline_deploy(tiny_omni), in_process=True) as pipeline:
        yield pipeline


@pytest.fixture(scope="module")
def sync_stream(tiny_omni):
    return run(tiny_omni, record_payloads=True)


def test_outputs_have_text_and_audio(sync_stream):
    outputs, payloads, _ = sync_stream
    for ids, audio in outputs:
        assert len(ids) == 12
        assert audio.shape == (20 * 8,) and audio.dtype.name == "float32"
    # thinker->talker: one payload per request; talker->vocoder: 1 + ceil(18/4) chunks + last.
    edges = sorted({edge for (_, edge, _) in payloads})
    assert edges == ["talker->vocoder", "thinker->talker"]


def test_sync_and_async_producers_send_byte_identical_payloads(tiny_omni, sync_stream):
    outputs, payloads, _ = sync_stream
    async_outputs, async_payloads, _ = run(
        tiny_omni, record_payloads=True, async_scheduling=True, executor_backend="thread"
    )
    assert_same(outputs, async_outputs)
    assert payloads.keys() == async_payloads.keys()
    for key, data in payloads.items():
        assert async_payloads[key] == data, key


def test_payloads_stay_identical_under_chunked_prefill_and_preemption(tiny_omni):
    """A tiny KV budget and token budget: prompts are chunked, requests preempted and
    recomputed. Tokens, audio and every payload's positions, ids and metadata are the
    same in both modes. The hidden states agree to float64 rounding only: the two modes
    preempt at different steps (async counts in-flight tokens when it reserves blocks),
    so the same positions are computed in differently shaped batches."""
    from omnistage.core.payload import unpack_payload

    prompts = [f"{i} " + "lorem ipsum dolor sit amet " * (1 + i % 4) for i in range(12)]
    tight = {
        "num_kv_blocks": 16,
        "max_model_len": 256,
        "max_num_batched_tokens": 32,
        "enable_prefix_caching": False,
    }
    results = []
    for mode in ({}, {"async_scheduling": True, "executor_backend": "thread"}):
        deploy = tiny_pipeline_deploy(tiny_omni, ar_engine_args=tight, **mode)
        with Omni(deploy, in_process=True) as omni:
            recorded = {}
            _record_puts(omni, recorded)
            outputs = omni.generate(prompts)
            scheduler = omni.orchestrator.clients["thinker"].core.engine.core.scheduler
            assert scheduler.num_preemptions > 0
            index = {o.request_id: i for i, o in enumerate(outputs)}
            results.append(
                (
                    [(o.error, o.token_ids, o.audio.tobytes()) for o in outputs],
                    {(index[r], e, c): unpack_payload(d) for (r, e, c), d in recorded.items()},
                )
            )
    (outputs_sync, payloads_sync), (outputs_async, payloads_async) = results
    assert outputs_sync == outputs_async
    assert payloads_sync.keys() == payloads_async.keys()
    for key, payload in payloads_sync.items():
        assert_same_payload(payloads_async[key], payload, key)


def test_stream_and_payload_transfer_give_the_same_audio(tiny_omni, sync_stream):
    outputs, _, _ = sync_stream
    whole, payloads, _ = run(tiny_omni, transfer="payload", record_payloads=True)
    assert_same(outputs, whole)
    assert all(chunk == 0 for (_, edge, chunk) in payloads if edge == "talker->vocoder")


@pytest.mark.parametrize("connector", ["inproc", "zmq"])
def test_every_connector_gives_the_same_outputs(tiny_omni, sync_stream, connector):
    outputs, _, _ = sync_stream
    other, _, counters = run(tiny_omni, connector=connector)
    assert_same(outputs, other)
    assert all(v == 0 for c in counters.values() for v in c.values())


def test_stream_chunks_follow_first_chunk_size_then_chunk_size(tiny_omni, sync_stream):
    from omnistage.core.payload import unpack_payload

    _, payloads, _ = sync_stream
    chunks = [
        unpack_payload(data)
        for (i, edge, _), data in sorted(payloads.items())
        if i == 0 and edge == "talker->vocoder"
    ]
    # 20 codes: a first chunk of 2, then 4 each; the last holds what is left.
    assert [c["ids.output"].numel() for c in chunks] == [2, 4, 4, 4, 4, 2]
    assert [c["meta.chunk_index"] for c in chunks] == list(range(6))
    assert [c["meta.finished"] for c in chunks] == [False] * 5 + [True]


def test_counters_return_to_zero(sync_stream):
    _, _, counters = sync_stream
    assert set(counters) == {"thinker", "talker", "vocoder"}
    for stage, values in counters.items():
        assert all(v == 0 for v in values.values()), (stage, values)


def test_text_only_request_runs_only_the_thinker(omni, sync_stream):
    outputs, _, _ = sync_stream
    talker = omni.orchestrator.clients["talker"].core
    queries = talker.engine.kv_cache_manager.prefix_queries
    (out,) = omni.generate([PROMPTS[0]], modalities=["text"])
    assert list(out.outputs) == ["thinker"]
    assert out.token_ids == outputs[0][0] and out.audio is None
    assert talker.engine.kv_cache_manager.prefix_queries == queries  # never reached


def test_per_stage_sampling_params(omni):
    (out,) = omni.generate(
        ["abc"],
        {
            "thinker": SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
            "talker": SamplingParams(temperature=0.8, seed=3, max_tokens=7, ignore_eos=True),
        },
    )
    assert len(out.token_ids) == 5
    assert out.audio.shape == (7 * 8,)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prompts": [123]}, "prompt"),
        ({"prompts": [""]}, "prompt: the prompt is empty"),
        ({"prompts": [{"prompt_token_ids": []}]}, "prompt_token_ids"),
        ({"modalities": ["image"]}, "modalities: 'image' cannot be produced"),
        ({"sampling_params": {"nope": SamplingParams()}}, "no stage named 'nope'"),
        ({"sampling_params": SamplingParams(n=2)}, "n: multi-stage"),
        ({"sampling_params": "greedy"}, "sampling_params"),
    ],
)
def test_bad_requests_are_refused_before_anything_runs(omni, kwargs, match):
    args = {"prompts": ["ok"], **kwargs}
    with pytest.raises(ValueError, match=match):
        omni.generate(**args)
    # ... and the pipeline keeps serving
    assert omni.generate(["ok"])[0].error is None


def test_bad_input_inside_a_stage_fails_only_that_request(omni):
    bad, good = omni.generate([{"prompt_token_ids": [5, 100000]}, "fine"])
    assert bad.finished and "stage thinker" in bad.error and "outside the vocabulary" in bad.error
    assert good.error is None and len(good.token_ids) == 12
    assert all(v == 0 for c in omni.stage_counters().values() for v in c.values())


def test_hidden_states_payload_matches_the_thinker_forward(tiny_omni, sync_stream):
    """The talker's prompt embeddings are exactly the thinker's final hidden states."""
    from omnistage.core.payload import unpack_payload

    _, payloads, _ = sync_stream
    payload = unpack_payload(payloads[(0, "thinker->talker", 0)])
    hidden = payload["hidden_states.output"]
    ids = torch.cat([payload["ids.prompt"], payload["ids.output"]])
    assert hidden.dtype == torch.float64
    assert hidden.shape[0] == ids.numel() - 1  # every position but the last sampled token
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(tiny_omni / "thinker", dtype=torch.float64)
    with torch.no_grad():
        expected = ref(ids[None, :-1], output_hidden_states=True).hidden_states[-1][0]
    # (rotary tables are float32 in transformers, float64 here: ~1e-6 apart)
    torch.testing.assert_close(hidden, expected, rtol=1e-4, atol=1e-5)


def test_packaged_deploy_file_runs_on_a_multi_part_checkpoint(tiny_omni):
    with Omni("tiny-three-stage", model=str(tiny_omni), in_process=True) as omni:
        assert [s.name for s in omni.deploy.stages] == ["thinker", "talker", "vocoder"]
        (out,) = omni.generate(["hello"])
        assert out.error is None and out.text is not None
        assert out.audio is not None and out.sample_rate == 16000


def test_one_model_is_a_one_stage_pipeline_with_the_llm_outputs(tiny_llama_f64):
    from omnistage import LLM

    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prompts = ["one", "two two", "three three three"]
    llm = LLM(model=str(tiny_llama_f64), dtype="float64", async_scheduling=False)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    with Omni(model=str(tiny_llama_f64), dtype="float64", in_process=True) as omni:
        assert [s.name for s in omni.deploy.stages] == ["llm"]
        outputs = omni.generate(prompts, params)
    assert [o.token_ids for o in outputs] == expected


def test_a_lost_payload_fails_only_its_request(tiny_omni):
    with Omni(tiny_pipeline_deploy(tiny_omni), in_process=True) as omni:
        connector = omni.orchestrator.clients["talker"].core.connectors["shm"]
        real_get, calls = connector.get, []

        def flaky_get(handle, timeout=None):
            calls.append(handle.key)
            if len(calls) == 1:
                connector.cleanup(handle.key.split("/")[0])
                raise TimeoutError(f"payload {handle.key!r} did not arrive within 30 s")
            return real_get(handle, timeout)

        connector.get = flaky_get
        outputs = omni.generate(["first", "second"])
        lost, fine = sorted(outputs, key=lambda o: o.error is None)
        assert lost.error.startswith("stage talker: payload") and "did not arrive" in lost.error
        assert fine.error is None and fine.audio is not None
        assert all(v == 0 for c in omni.stage_counters().values() for v in c.values())


def test_repeated_prompts_work_with_hidden_states_on_the_edge(omni, sync_stream):
    """A prefix-cache hit would skip positions whose hidden states the talker needs:
    stages whose edges carry hidden states run without prefix caching."""
    outputs, _, _ = sync_stream
    thinker = omni.orchestrator.clients["thinker"].core.engine
    assert not thinker.config.enable_prefix_caching
    again = omni.generate([PROMPTS[3]] * 3)  # 40 chars: several full blocks
    assert all(o.error is None for o in again)
    assert_same([(o.token_ids, o.audio) for o in again], [outputs[3]] * 3)


def test_a_broken_payload_fails_its_request_not_the_stage(tiny_omni, monkeypatch):
    from omnistage.pipeline.accumulator import RequestAccumulator

    original = RequestAccumulator.add_step

    def breaking(self, *args):
        if self.request_id.startswith("omni-0-"):  # the first request of this Omni
            raise RuntimeError("simulated accumulator bug")
        original(self, *args)

    monkeypatch.setattr(RequestAccumulator, "add_step", breaking)
    with Omni(tiny_pipeline_deploy(tiny_omni), in_process=True) as omni:
        broken, fine = omni.generate(["break me", "fine"])
        assert broken.error == "stage thinker: RuntimeError: simulated accumulator bug"
        assert fine.error is None and fine.audio is not None
        assert omni.generate(["after"])[0].error is None
        assert all(v == 0 for c in omni.stage_counters().values() for v in c.values())


def test_streamed_updates_add_up_to_the_final_output(tiny_omni, sync_stream):
    import asyncio

    import numpy as np

    from omnistage.pipeline.omni import AsyncOmni

    outputs, _, _ = sync_stream
    omni = AsyncOmni(tiny_pipeline_deploy(tiny_omni), in_process=True)

    async def collect():
        return [u async for u in omni.generate(PROMPTS[0])]

    try:
        updates = asyncio.run(collect())
    finally:
        omni.shutdown()
    final = updates[-1]
    assert final.finished and [u.finished for u in updates[:-1]] == [False] * (len(updates) - 1)
    pieces = [u.new_data.numpy() for u in updates if u.new_data is not None]
    assert len(pieces) == 6  # one per stream chunk, the last one with the final output
    assert (np.concatenate(pieces) == final.audio).all()
    assert (final.audio == outputs[0][1]).all()
    text = "".join(u.new_text for u in updates if u.stage == "thinker")
    assert text == final.text
    assert sum((u.new_token_ids for u in updates if u.stage == "thinker"), []) == final.token_ids


def test_streaming_into_the_talker_is_identical_sync_async_and_across_processes(tiny_omni, omni):
    """thinker -> talker as a stream: the talker starts after the thinker's first chunk and
    keeps pace with it, one thinker hidden state per talker step."""
    results = []
    for mode in (
        {"in_process": True},
        {"in_process": True, "async_scheduling": True, "executor_backend": "thread"},
    ):
        in_process = mode.pop("in_process")
        deploy = tiny_pipeline_deploy(tiny_omni, thinker_transfer="stream", **mode)
        with Omni(deploy, in_process=in_process) as streaming:
            outputs = streaming.generate(PROMPTS)
            counters = streaming.stage_counters()
        assert all(o.error is None for o in outputs), [o.error for o in outputs]
        assert all(v == 0 for c in counters.values() for v in c.values()), counters
        results.append([(o.token_ids, o.audio.tobytes()) for o in outputs])
    assert results[0] == results[1]
    # The talker really is conditioned on the stream: payload transfer gives other codes.
    whole = [(o.token_ids, o.audio.tobytes()) for o in omni.generate(PROMPTS)]
    assert [t for t, _ in whole] == [t for t, _ in results[0]]
    assert [a for _, a in whole] != [a for _, a in results[0]]
