"""GLM-Image's autoregressive prior on our hot path, against transformers.

One tiny float64 `GlmImageForConditionalGeneration` checkpoint with its processor. Its
prompts are built by `GlmImagePriorPrompter` (the processor's chat template plus the
target grids; the 3-D positions of the prompt and of every generated token), the
reference is `GlmImageForConditionalGeneration.generate(do_sample=False,
max_new_tokens=<grid cells + 1>)` on the processor's own inputs, as diffusers'
`GlmImagePipeline.generate_prior_tokens` calls it: the preview grid, the large grid and
the end token must come out token for token, in sync and async scheduling, alone and in
a batch of mixed sizes (with chunked prefill and preemption by recompute). transformers
computes RMSNorm and the rotary tables in float32 even for a float64 model, hence the
logit tolerances. Everything runs on one thread: a few hundred tiny steps per request are
dominated by thread hand-offs, which cost far more than they save on a shared 2-core box.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.engine.llm_engine import LLMEngine
from omnistage.families.glm_image.prior_prompt import GlmImagePriorPrompter
from omnistage.families.glm_image.tiny import IMAGE_START_ID, save_tiny_glm_image_prior

CASES = {  # name: (prompt, height, width)
    "wide": ("a red fox in the snow", 64, 96),
    "tall": ("a lighthouse", 128, 64),
    "square": ("two cats", 96, 96),
}


@contextlib.contextmanager
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_tiny_glm_image_prior(tmp_path_factory.mktemp("glm-image-prior"))


@pytest.fixture(scope="module")
def hf_model(ckpt):
    from transformers import GlmImageForConditionalGeneration

    return GlmImageForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float64).eval()


@pytest.fixture(scope="module")
def prompter(ckpt):
    return GlmImagePriorPrompter.from_checkpoint(ckpt)


def hf_inputs(prompter, prompt, height, width):
    messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
    return prompter.processor.apply_chat_template(
        messages,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        processor_kwargs={"target_h": height, "target_w": width},
    )


@pytest.fixture(scope="module")
def reference(hf_model, prompter):
    """Per case: transformers' greedy tokens, raw logits per step and decode positions."""
    out = {}
    for name, (prompt, height, width) in CASES.items():
        inputs = hf_inputs(prompter, prompt, height, width)
        with torch.no_grad(), one_thread():
            gen = hf_model.generate(
                **inputs,
                max_new_tokens=prompter.max_new_tokens(height, width),
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
        out[name] = dict(
            tokens=gen.sequences[0, inputs["input_ids"].shape[1] :].tolist(),
            logits=torch.stack([step[0] for step in gen.logits]),
            table=hf_model.model._cached_decode_position_ids[0].clone(),
            ids=inputs["input_ids"][0].tolist(),
        )
    return out


def engine(ckpt, async_scheduling: bool, **args) -> LLMEngine:
    config = EngineConfig(
        model=str(ckpt), dtype="float64", async_scheduling=async_scheduling, num_threads=1, **args
    )
    with one_thread():  # a sync engine sets the threads of this process
        return LLMEngine(config)


def generate(eng: LLMEngine, prompter, names: list[str]) -> dict[str, list[int]]:
    """Greedy outputs of the cases `names`, submitted together, through the engine."""
    for name in names:
        prompt, height, width = CASES[name]
        stage_input = prompter.build(prompt, height, width)
        params = SamplingParams(temperature=0, max_tokens=prompter.max_new_tokens(height, width))
        eng.add_tokenized_request(
            name,
            None,
            stage_input.prompt_token_ids,
            params,
            mm_decoder_inputs=stage_input.mm_decoder_inputs,
        )
    done = {}
    with one_thread():
        while eng.has_unfinished_requests():
            for out in eng.step():
                if out.finished:
                    done[out.request_id] = out.outputs[0].token_ids
    return done


def test_prompt_and_positions_match_the_processor_and_get_rope_index(prompter, reference):
    for name, (prompt, height, width) in CASES.items():
        stage_input = prompter.build(prompt, height, width)
        ref = reference[name]
        assert stage_input.prompt_token_ids == ref["ids"]
        assert stage_input.prompt_token_ids[-1] == IMAGE_START_ID
        mm = stage_input.mm_decoder_inputs
        n = len(ref["ids"])
        assert torch.equal(mm.mrope_positions, torch.arange(n).expand(3, n))
        assert torch.equal(mm.decode_positions, ref["table"])
        assert mm.decode_positions.shape[1] == prompter.max_new_tokens(height, width)


def test_logits_and_greedy_tokens_match_transformers(ckpt, prompter, reference):
    """Sync, one request at a time: every step's logits (prefill, preview grid, large
    grid, end) within tolerance of `generate`'s, and the same tokens."""
    eng = engine(ckpt, async_scheduling=False)
    runner = eng.core.executor.runner
    seen: list[torch.Tensor] = []
    runner.add_sample_observer(lambda event: seen.append(event.logits))
    try:
        for name in ("wide", "tall"):
            seen.clear()
            tokens = generate(eng, prompter, [name])[name]
            ref = reference[name]
            ours = torch.cat(seen).double()
            assert ours.shape == ref["logits"].shape  # [grid cells + 1, vision vocab]
            torch.testing.assert_close(ours, ref["logits"].double(), rtol=1e-4, atol=1e-4)
            assert tokens == ref["tokens"]
    finally:
        eng.shutdown()


def test_batch_of_mixed_sizes_async_matches_transformers(ckpt, prompter, reference):
    eng = engine(ckpt, async_scheduling=True)
    try:
        outs = generate(eng, prompter, list(CASES))
    finally:
        eng.shutdown()
    for name in CASES:
        assert outs[name] == reference[name]["tokens"], name


def test_chunked_prefill_and_preemption_keep_the_positions(ckpt, prompter, reference):
    """A tiny token budget chunks every prompt and the KV cache holds fewer blocks than
    the batch needs: preempted requests recompute their outputs through prefill, at
    their decode positions."""
    eng = engine(
        ckpt,
        async_scheduling=True,
        num_kv_blocks=40,
        block_size=16,
        max_model_len=512,
        max_num_batched_tokens=16,
    )
    try:
        outs = generate(eng, prompter, list(CASES))
        assert eng.core.scheduler.num_preemptions > 0
    finally:
        eng.shutdown()
    for name in CASES:
        assert outs[name] == reference[name]["tokens"], name


def test_past_the_table_repeats_its_last_column_as_batched_generate_does(ckpt, hf_model, prompter):
    """transformers pads the decode tables of a batch to the longest with their last
    column: a request generating past its own table (here "tall", 4 tokens past it,
    batched with "wide") rotates those tokens at its end-token position."""
    (pa, ha, wa), (pb, hb, wb) = CASES["wide"], CASES["tall"]
    a, b = hf_inputs(prompter, pa, ha, wa), hf_inputs(prompter, pb, hb, wb)
    length = max(a["input_ids"].shape[1], b["input_ids"].shape[1])
    pad = prompter.processor.tokenizer.pad_token_id

    def left_pad(enc, key, value):
        x = enc[key]
        return torch.cat([torch.full((1, length - x.shape[1]), value), x], dim=1)

    steps = prompter.max_new_tokens(ha, wa)
    assert steps > prompter.max_new_tokens(hb, wb)
    with torch.no_grad(), one_thread():
        gen = hf_model.generate(
            input_ids=torch.cat([left_pad(a, "input_ids", pad), left_pad(b, "input_ids", pad)]),
            attention_mask=torch.cat(
                [left_pad(a, "attention_mask", 0), left_pad(b, "attention_mask", 0)]
            ),
            image_grid_thw=torch.cat([a["image_grid_thw"], b["image_grid_thw"]]),
            images_per_sample=torch.tensor([2, 2]),
            max_new_tokens=steps,
            do_sample=False,
        )
    eng = engine(ckpt, async_scheduling=False)
    try:
        stage_input = prompter.build(pb, hb, wb)
        eng.add_tokenized_request(
            "tall",
            None,
            stage_input.prompt_token_ids,
            SamplingParams(temperature=0, max_tokens=steps),
            mm_decoder_inputs=stage_input.mm_decoder_inputs,
        )
        tokens = None
        with one_thread():
            while eng.has_unfinished_requests():
                for out in eng.step():
                    tokens = out.outputs[0].token_ids if out.finished else tokens
    finally:
        eng.shutdown()
    assert tokens == gen[1, length:].tolist()


@pytest.mark.parametrize(
    ("height", "width", "field"),
    [(100, 96, "height"), (64, 70, "width"), (0, 64, "height"), (32, 32 * 300, "height")],
)
def test_bad_size_is_refused_naming_it(prompter, height, width, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        prompter.build("a cat", height, width)
    with pytest.raises(ValueError, match=f"^{field}: "):
        prompter.max_new_tokens(height, width)


def test_prompts_with_images_are_refused(prompter):
    with pytest.raises(ValueError, match="^images: .*image-to-image"):
        prompter.build("make it blue", 64, 64, images=[torch.zeros(32, 32, 3)])
    with pytest.raises(ValueError, match="^prompt: .*image-to-image"):
        prompter.build("make <|image|> blue", 64, 64)


def test_pipeline_stage_builds_the_prompt_and_the_token_budget(ckpt, reference):
    """The AR stage of a pipeline: a GLM-Image request's prompt is built for its
    `image_size`, and it writes exactly the grids' tokens whatever `max_tokens` says."""
    from omnistage.pipeline.ar_stage import ARStageCore
    from omnistage.pipeline.deploy import single_model_deploy
    from omnistage.pipeline.messages import StageOutput, SubmitRequest

    args = {"dtype": "float64", "async_scheduling": False, "num_threads": 1}
    spec = single_model_deploy(str(ckpt), args)
    stage = ARStageCore(spec.stages[0], spec, "glm-image-prior-test")
    try:
        prompt, height, width = CASES["wide"]
        with pytest.raises(ValueError, match="^image_size: .*height, width"):
            stage.start(SubmitRequest(request_id="x", prompt=prompt), None)
        with pytest.raises(ValueError, match="^images: .*image-to-image"):
            stage.start(
                SubmitRequest(
                    request_id="y", prompt=prompt, image_size=[height, width], images=[b""]
                ),
                None,
            )
        sampling = {"temperature": 0, "max_tokens": 3}
        submit = SubmitRequest(
            request_id="r", prompt=prompt, sampling=sampling, image_size=[height, width]
        )
        stage.start(submit, None)
        tokens: list[int] = []
        finished = False
        while not finished:
            for event in stage.step():
                if isinstance(event, StageOutput) and event.request_id == "r":
                    tokens += event.new_token_ids
                    finished = event.finished
        assert tokens == reference["wide"]["tokens"]
    finally:
        stage.shutdown()


def test_decode_positions_cross_the_wire_and_salt_the_cache():
    import msgspec

    from omnistage.core.multimodal_inputs import MultimodalDecoderData, MultimodalDecoderInputs

    table = torch.tensor([[5, 5, 5, 7], [5, 5, 6, 7], [5, 6, 5, 7]])
    mm = MultimodalDecoderInputs(
        mrope_positions=torch.arange(5).expand(3, 5), decode_positions=table
    )
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(mm.to_data()), type=MultimodalDecoderData)
    back = MultimodalDecoderInputs.from_data(wire, torch.device("cpu"), torch.float64)
    assert torch.equal(back.decode_positions, table) and back.digest() == mm.digest()
    # Past the table: its last column, as transformers' batched `generate` pads it.
    assert back.output_positions(2, 4).tolist() == [[5, 7, 7, 7], [6, 7, 7, 7], [5, 7, 7, 7]]
    other = MultimodalDecoderInputs(mrope_positions=mm.mrope_positions, decode_positions=table + 1)
    plain = MultimodalDecoderInputs(mrope_positions=mm.mrope_positions)
    assert len({mm.digest(), other.digest(), plain.digest()}) == 3


@pytest.mark.parametrize(
    ("table", "delta", "mrope", "message"),
    [
        (torch.zeros(2, 4, dtype=torch.long), 0, True, r"expected shape \(3, N\)"),
        (torch.zeros(3, 4), 0, True, "integer torch.Tensor"),
        (torch.full((3, 4), 64), 0, True, r"lie in \[0, 64\)"),
        (torch.zeros(3, 4, dtype=torch.long), -1, True, "either decode_positions or rope_delta"),
        (torch.zeros(3, 4, dtype=torch.long), 0, False, "does not take 3-D"),
    ],
)
def test_bad_decode_positions_are_refused(table, delta, mrope, message):
    from omnistage.core.multimodal_inputs import MultimodalDecoderInputs

    prompt = torch.zeros(3, 5, dtype=torch.long) if mrope else None
    mm = MultimodalDecoderInputs(mrope_positions=prompt, rope_delta=delta, decode_positions=table)
    with pytest.raises(ValueError, match=f"^mm_decoder_inputs: decode_positions: .*{message}"):
        mm.check(5, 64, 64, 2, supports_mrope=mrope, supports_deepstack=False)
