"""The Qwen2.5-Omni pipeline (thinker -> talker -> token2wav, the packaged `qwen25-omni`
deploy that `Omni(model=...)` picks for `qwen2_5_omni` checkpoints) against transformers'
`Qwen2_5OmniForConditionalGeneration.generate`, on the float64 tiny checkpoint.

transformers runs greedy (`talker_do_sample=False`: argmax after the repetition penalty
1.05 and the `tts_codec_start` suppression); our stages run temperature 0 with the same
penalty. transformers' token2wav is handed our starting noise for `seed=SEED` (its one
`torch.randn` replaced; tests/models/test_qwen25_omni_token2wav.py).

**Streaming.** The packaged deploy streams the codes to token2wav, and a reply shorter
than its first chunk plus right context (36 + 24 codes, e.g. the 12 codes here) is decoded
in one piece at the end, exactly as a payload. Longer replies are decoded chunk by chunk
with codes of context on both sides; with the tiny model's context (24 codes either side,
6 DiT blocks) the streamed audio equals the whole-payload audio to ~1e-7 (float32 output
rounding), and every chunk brings exactly 480 samples per code of its own.

**The talker's codec rows.** Our talker prompt is `qwen25_talker_inputs(codec_rows=True)`:
its last two rows carry the `tts_codec_pad` / `tts_codec_start` embeddings, which
transformers' talker adds itself whenever it is given an attention mask. transformers
5.23's `GenerationMixin.generate` drops the all-ones mask of an unpadded request before
the first forward, so its plain `generate` leaves them out (a bug; rows of a left-padded
batch get them; see families/qwen25_omni/model.py). The reference therefore hands the
talker's prefill forward the all-ones mask that `generate` dropped (`_talker_with_mask`),
and the test checks that the prompt it fed `thinker_to_talker_proj` is our
`codec_rows=True` prompt. The decode steps are untouched (transformers passes no mask
there in either case).

token2wav runs in float64 here (the pipeline's dtype) from the same float32 noise;
transformers keeps that part in float32, hence the audio tolerance (1e-5; the
float32-vs-float32 parity of the part alone is in test_qwen25_omni_token2wav.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
from unittest import mock

import pytest
import torch

from omnistage import SamplingParams
from omnistage.families.qwen25_omni.model import Qwen25TalkerSpecials, qwen25_talker_inputs
from omnistage.families.qwen25_omni.tiny import make_tiny_qwen25_omni
from omnistage.families.qwen25_omni.tiny_config import (
    CODEBOOK_SIZE,
    CODEC_IDS,
    SAMPLE_RATE,
    SAMPLES_PER_CODE,
)
from omnistage.families.qwen25_omni.tiny_processor import IM_END_ID
from omnistage.models import registry
from omnistage.models.generation import load_generation_model
from omnistage.pipeline.deploy import deploy_for_model, packaged_deploy_path
from omnistage.pipeline.generation_stage import derived_seed
from omnistage.pipeline.messages import SubmitRequest
from omnistage.pipeline.omni import AsyncOmni, Omni

THINKER_TOKENS, TALKER_TOKENS, SEED = 8, 12, 11
CHAT = [
    {"role": "system", "content": "You are a tiny test model."},
    {"role": "user", "content": "Say something."},
]
GREEDY = {
    "thinker": SamplingParams(temperature=0, max_tokens=THINKER_TOKENS),
    "talker": SamplingParams(temperature=0, max_tokens=TALKER_TOKENS, repetition_penalty=1.05),
}
SEEDED = {**GREEDY, "token2wav": SamplingParams(seed=SEED)}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: thread hand-offs would dominate (the DiT runs ~40 tiny forwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_qwen25_omni(tmp_path_factory.mktemp("qwen25-omni-pipe"), dtype=torch.float64)


def _talker_with_mask(talker):
    """Give the talker's prefill forward the all-ones attention mask `generate` dropped (so
    it adds the codec rows of its last two prompt rows, as it does for padded batches)."""
    forward = talker.forward

    @functools.wraps(forward)  # generate checks its kwargs against the signature
    def masked(*args, **kwargs):
        cache = kwargs.get("past_key_values")
        if kwargs.get("attention_mask") is None and (cache is None or cache.get_seq_length() == 0):
            embeds = kwargs["inputs_embeds"]
            kwargs["attention_mask"] = torch.ones(embeds.shape[:2], dtype=torch.long)
        return forward(*args, **kwargs)

    return masked


@pytest.fixture(scope="module")
def reference(ckpt):
    """transformers' greedy `generate` (talker given its prefill mask), with what it fed the
    talker and token2wav."""
    from transformers import AutoTokenizer, Qwen2_5OmniForConditionalGeneration

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float64).eval()
    tok = AutoTokenizer.from_pretrained(ckpt)
    prompt = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt").input_ids
    fed: list[torch.Tensor] = []
    hook = model.talker.thinker_to_talker_proj.register_forward_pre_hook(
        lambda module, args: fed.append(args[0][0].clone())
    )
    codes: list[torch.Tensor] = []
    token2wav = model.token2wav.forward

    noise = load_generation_model(ckpt, torch.float32, part="token2wav").noise

    def recording(code, **kwargs):
        codes.append(code[0].clone())
        ours = noise(SEED, 0, 2 * code.shape[1])  # token2wav's one torch.randn draws ours
        with mock.patch("torch.randn", lambda *args, **kwargs: ours.clone()):
            return token2wav(code, **kwargs)

    model.talker.forward = _talker_with_mask(model.talker)
    model.token2wav.forward = recording
    try:
        with torch.no_grad():
            sequences, wav = model.generate(
                ids,
                thinker_max_new_tokens=THINKER_TOKENS,
                talker_max_new_tokens=TALKER_TOKENS,
                talker_do_sample=False,
                thinker_eos_token_id=IM_END_ID,
            )
    finally:
        hook.remove()
        del model.talker.forward, model.token2wav.forward
    prompt_ids, output_ids = ids[0].tolist(), sequences[0, ids.shape[1] :].tolist()
    with torch.no_grad():  # the thinker rows the talker input is built from
        states = model.thinker(input_ids=sequences[:, :-1], output_hidden_states=True).hidden_states
    return {
        "prompt": prompt,
        "prompt_ids": prompt_ids,
        "output_ids": output_ids,
        "thinker_embeds": states[0][0],
        "thinker_hidden": states[-1][0],
        "talker_prefill": fed[0],
        "codes": codes[0].tolist(),
        "wav": wav.reshape(-1),
    }


@pytest.fixture(scope="module")
def omni(ckpt):
    """`Omni(model=...)`: the packaged deploy, async scheduling (the default), float64."""
    with Omni(model=str(ckpt), in_process=True, dtype="float64", num_threads=1) as omni:
        yield omni


@pytest.fixture(scope="module")
def omni_sync(ckpt):
    """The same deploy with sync scheduling, its talker made a final stage (tokens) so that
    its codes come back to the caller."""
    args = {"dtype": "float64", "num_threads": 1, "async_scheduling": False}
    spec = deploy_for_model(str(ckpt), args)
    stages = tuple(
        dataclasses.replace(s, final_output=True, final_output_type="tokens")
        if s.name == "talker"
        else s
        for s in spec.stages
    )
    with Omni(dataclasses.replace(spec, stages=stages), in_process=True) as omni:
        yield omni


@pytest.fixture(scope="module")
def seeded_async(omni, reference):
    (out,) = omni.generate([reference["prompt"]], SEEDED)
    assert out.error is None
    return out


def test_packaged_deploy_and_defaults(ckpt):
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    spec = deploy_for_model(str(ckpt), {"dtype": "float64"})
    assert spec.source == str(packaged_deploy_path("qwen25-omni"))
    assert [(s.name, s.kind, s.model_part) for s in spec.stages] == [
        ("thinker", "ar", "thinker"),
        ("talker", "ar", "talker"),
        ("token2wav", "generation", "token2wav"),
    ]
    assert {s.model for s in spec.stages} == {str(ckpt.absolute())}
    assert all(s.engine_args["dtype"] == "float64" for s in spec.stages)
    assert [(e.src, e.dst, e.processor, e.transfer) for e in spec.edges] == [
        ("thinker", "talker", "qwen25_omni_thinker_to_talker", "payload"),
        ("talker", "token2wav", "ids_to_codes", "stream"),
    ]
    # Codes stream to token2wav in DiT blocks (24 mel frames, 12 codes): a first chunk of
    # one block of audio plus the right context, then 4 blocks; context of twice one DiT
    # pass' reach (look_backward_layers: 2 blocks back, look_ahead_layers: 1 ahead).
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import (
        Qwen2_5OmniDiTConfig,
    )

    dit = Qwen2_5OmniDiTConfig()
    block = dit.block_size // dit.repeats
    assert (block, len(dit.look_backward_layers), len(dit.look_ahead_layers)) == (12, 2, 1)
    codes = spec.edges[1]
    assert (codes.left_context, codes.right_context) == (4 * block, 2 * block)
    assert (codes.first_chunk_size, codes.chunk_size) == (block + 2 * block, 4 * block)
    # The real model's defaults, as transformers' `generate` has them.
    hf = {
        name: p.default
        for name, p in inspect.signature(
            Qwen2_5OmniForConditionalGeneration.generate
        ).parameters.items()
    }
    thinker, talker = spec.stage("thinker"), spec.stage("talker")
    assert thinker.default_sampling == {"temperature": 0.0, "max_tokens": 1024}
    assert hf["thinker_max_new_tokens"] == 1024
    assert talker.default_sampling == {
        "temperature": hf["talker_temperature"],
        "top_k": hf["talker_top_k"],
        "top_p": hf["talker_top_p"],
        "repetition_penalty": hf["talker_repetition_penalty"],
        "max_tokens": hf["talker_max_new_tokens"],
        "stop_token_ids": [8292],
    }
    # The part ends at tts_codec_end, the deploy adds tts_codec_pad: generate's eos pair.
    real = Qwen2_5OmniConfig().talker_config
    assert registry.part_spec("qwen2_5_omni", "talker").eos_token_id == (
        "talker_config",
        "tts_codec_end_token_id",
    )
    assert (
        sorted([real.tts_codec_end_token_id, *talker.default_sampling["stop_token_ids"]])
        == (hf["talker_eos_token_id"])
    )


def test_reference_talker_got_the_codec_rows(ckpt, reference):
    """The reference's talker prompt is our `codec_rows=True` prompt (see the docstring)."""
    specials = Qwen25TalkerSpecials.from_checkpoint(ckpt, torch.float64)
    args = (
        reference["thinker_embeds"],
        reference["thinker_hidden"],
        reference["prompt_ids"],
        reference["output_ids"],
        specials,
    )
    ours = qwen25_talker_inputs(*args)
    torch.testing.assert_close(reference["talker_prefill"], ours.prompt_embeds, rtol=0, atol=1e-10)
    without = qwen25_talker_inputs(*args, codec_rows=False)
    assert not torch.allclose(reference["talker_prefill"], without.prompt_embeds)
    codes = reference["codes"]
    assert len(codes) == TALKER_TOKENS and max(codes) < CODEBOOK_SIZE and len(set(codes)) > 3


def test_pipeline_text_and_audio_equal_transformers(ckpt, reference, seeded_async):
    out = seeded_async
    assert set(out.outputs) == {"thinker", "token2wav"}
    assert out.token_ids == reference["output_ids"]
    assert len(out.token_ids) == THINKER_TOKENS  # the tiny thinker does not end by itself
    assert out.sample_rate == SAMPLE_RATE
    wav = torch.from_numpy(out.audio)
    assert wav.shape == reference["wav"].shape == (TALKER_TOKENS * SAMPLES_PER_CODE,)
    assert wav.std() > 1e-2
    # float64 (ours) vs float32 (transformers) token2wav, from the same noise.
    torch.testing.assert_close(wav, reference["wav"], rtol=0, atol=5e-5)
    # What the stage decoded: exactly the reference's codes with that seed (streamed, but 12
    # codes are fewer than the first chunk: one item at the end, the whole decode).
    vocoder = load_generation_model(ckpt, torch.float64, part="token2wav")
    expected = vocoder.decode(torch.tensor(reference["codes"]), seed=SEED)
    torch.testing.assert_close(wav, expected, rtol=0, atol=1e-12)


def test_talker_codes_equal_transformers_and_sync_equals_async(
    ckpt, reference, seeded_async, omni, omni_sync
):
    (sync,) = omni_sync.generate([reference["prompt"]], SEEDED)
    assert sync.error is None
    talker = sync.outputs["talker"]
    assert talker.token_ids == reference["codes"]  # the tiny talker never ends by itself
    assert sync.token_ids == reference["output_ids"]
    assert torch.equal(torch.from_numpy(sync.audio), torch.from_numpy(seeded_async.audio))

    # Without a token2wav seed the stage derives one from the codes: the same audio in
    # either scheduling (and the decode of the codes with that seed).
    (a,) = omni.generate([reference["prompt"]], GREEDY)
    (s,) = omni_sync.generate([reference["prompt"]], GREEDY)
    assert a.error is None and s.error is None
    assert torch.equal(torch.from_numpy(a.audio), torch.from_numpy(s.audio))
    assert not torch.allclose(torch.from_numpy(a.audio), torch.from_numpy(seeded_async.audio))
    vocoder = load_generation_model(ckpt, torch.float64, part="token2wav")
    codes = torch.tensor(reference["codes"])
    expected = vocoder.decode(codes, seed=derived_seed(0, codes))
    torch.testing.assert_close(torch.from_numpy(a.audio), expected, rtol=0, atol=1e-12)


def test_a_request_s_voice_reaches_the_talker_and_token2wav(ckpt, reference, omni_sync):
    """`voice` (any case; `spk_dict.pt` spells it "Ethan") is the talker's speaker bos row
    and token2wav's conditioning; an unknown one is refused before any stage runs."""
    import omnistage.families.qwen25_omni.model as talker_inputs

    build = talker_inputs.qwen25_talker_inputs
    with mock.patch.object(talker_inputs, "qwen25_talker_inputs", wraps=build) as spy:
        (ethan,) = omni_sync.generate([reference["prompt"]], SEEDED, voice="ETHAN")
    assert ethan.error is None
    assert spy.call_args.kwargs["speaker"] == "Ethan"
    assert ethan.token_ids == reference["output_ids"]  # the thinker does not hear the voice
    # (the tiny talker's greedy codes happen not to change with its speaker row)
    codes = torch.tensor(ethan.outputs["talker"].token_ids)
    vocoder = load_generation_model(ckpt, torch.float64, part="token2wav")
    expected = vocoder.decode(codes, seed=SEED, speaker="Ethan")
    torch.testing.assert_close(torch.from_numpy(ethan.audio), expected, rtol=0, atol=1e-12)
    assert not torch.allclose(expected, vocoder.decode(codes, seed=SEED))  # Chelsie's
    with pytest.raises(ValueError, match="voice: 'alloy' is not one of chelsie, ethan"):
        omni_sync.generate([reference["prompt"]], voice="alloy")


LONG_TALKER_TOKENS = 60
TINY_STREAM = {"first_chunk_size": 28, "chunk_size": 8, "left_context": 24, "right_context": 24}
"""The tiny DiT's blocks are 4 codes: 6 blocks of context either side, a first chunk of one
block of audio plus the right context, then 2 blocks."""


def _tiny_deploy(ckpt, **edge):
    args = {"dtype": "float64", "num_threads": 1, "async_scheduling": False}
    spec = deploy_for_model(str(ckpt), args)
    edges = tuple(dataclasses.replace(e, **edge) if e.dst == "token2wav" else e for e in spec.edges)
    return dataclasses.replace(spec, edges=edges)


def test_streamed_audio_equals_whole_payload_audio(ckpt, reference):
    """60 codes streamed (chunks 28, then 8) with 24 codes of context either side equal the
    whole-payload decode to float32 output rounding (the codes beyond a chunk's window still
    move the DiT's mel a little, see families/qwen25_omni/token2wav.py; measured 6e-8 here).
    Each chunk brings exactly 480 samples per code it owns: the first 4 (28 minus the 24
    held back), then 8 per chunk, then the 24 held back when the talker ends."""
    params = {
        **SEEDED,
        "talker": dataclasses.replace(GREEDY["talker"], max_tokens=LONG_TALKER_TOKENS),
    }

    async def streamed() -> tuple[list[int], object]:
        sizes, last = [], None
        with AsyncOmni(_tiny_deploy(ckpt, **TINY_STREAM), in_process=True) as omni:
            async for out in omni.generate(reference["prompt"], params):
                if out.stage == "token2wav" and out.new_data is not None:
                    sizes.append(out.new_data.numel())
                last = out
        return sizes, last

    sizes, out = asyncio.run(streamed())
    with Omni(_tiny_deploy(ckpt, transfer="payload"), in_process=True) as omni:
        (whole,) = omni.generate([reference["prompt"]], params)
    assert out.error is None and whole.error is None
    assert out.token_ids == whole.token_ids == reference["output_ids"]
    assert sizes == [n * SAMPLES_PER_CODE for n in [4, 8, 8, 8, 8, 24]]
    assert out.audio.shape == whole.audio.shape == (LONG_TALKER_TOKENS * SAMPLES_PER_CODE,)
    streamed_wav, whole_wav = torch.from_numpy(out.audio), torch.from_numpy(whole.audio)
    assert whole_wav.std() > 1e-2
    torch.testing.assert_close(streamed_wav, whole_wav, rtol=0, atol=2e-7)

    # With one DiT pass' reach as context (2 blocks back, 1 ahead) the seams show.
    short = {**TINY_STREAM, "first_chunk_size": 8, "left_context": 8, "right_context": 4}
    with Omni(_tiny_deploy(ckpt, **short), in_process=True) as omni:
        (rough,) = omni.generate([reference["prompt"]], params)
    assert rough.audio.shape == whole.audio.shape
    assert (torch.from_numpy(rough.audio) - whole_wav).abs().max() > 1e-3


def test_text_only_request_runs_only_the_thinker(omni, reference):
    stages = omni.orchestrator.stages
    submitted: list[str] = []
    send = stages.send

    def recording(stage, msg):
        if isinstance(msg, SubmitRequest):
            submitted.append(stage)
        return send(stage, msg)

    stages.send = recording
    try:
        (out,) = omni.generate([reference["prompt"]], GREEDY, modalities=["text"])
    finally:
        del stages.send
    assert out.error is None
    assert submitted == ["thinker"]
    assert set(out.outputs) == {"thinker"} and out.audio is None
    assert out.token_ids == reference["output_ids"]
    assert all(v == 0 for c in omni.stage_counters().values() for v in c.values())


def test_talker_engine_takes_thinker_width_rows(ckpt):
    """The talker's engine checks prompt embeddings and conditioning rows against the
    thinker's width (`input_width`), not the talker's hidden size. The engine reads it
    from the part's config, not the model: with async scheduling (the `omni` fixture) the
    runner lives in a worker process."""
    from omnistage.config import EngineConfig
    from omnistage.engine.llm_engine import LLMEngine
    from omnistage.families.qwen25_omni.tiny_config import HIDDEN, TALKER_HIDDEN

    engine = LLMEngine(
        EngineConfig(
            model=str(ckpt),
            model_part="talker",
            dtype="float64",
            async_scheduling=False,
        )
    )
    try:
        assert engine.input_width == HIDDEN != TALKER_HIDDEN == engine.hf_config.hidden_size
        params = SamplingParams(temperature=0, max_tokens=3)
        ids = [CODEC_IDS["tts_codec_mask_token_id"]] * 4
        with pytest.raises(ValueError, match=rf"prompt_embeds: expected shape \(4, {HIDDEN}\)"):
            engine.add_tokenized_request("bad", None, ids, params, torch.zeros(4, TALKER_HIDDEN))
        engine.add_tokenized_request("r", None, ids, params, torch.zeros(4, HIDDEN), True)
        with pytest.raises(ValueError, match=rf"conditioning: expected \[rows, {HIDDEN}\]"):
            engine.add_conditioning("r", torch.zeros(2, TALKER_HIDDEN), True)
        engine.add_conditioning("r", torch.zeros(2, HIDDEN), True, torch.zeros(HIDDEN))
        outputs = []
        while engine.has_unfinished_requests():
            outputs.extend(engine.step())
        assert len(outputs[-1].outputs[0].token_ids) == 3
    finally:
        engine.shutdown()
