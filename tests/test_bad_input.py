"""Bad input gets a ValueError naming the problem, and the engine keeps serving."""

from __future__ import annotations

import json

import pytest

from omnistage import LLM, SamplingParams
from omnistage.config import EngineConfig


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama), max_model_len=64)


def serves(llm: LLM) -> bool:
    out = llm.generate(
        "ok", SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False
    )
    return (
        len(out[0].outputs[0].token_ids) == 3
        and llm.engine.num_free_kv_blocks() == llm.engine.num_usable_kv_blocks()
    )


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("", "prompt: the prompt is empty"),
        ({"prompt_token_ids": []}, "prompt: the prompt is empty"),
        ("x" * 64, "max_model_len=64"),
        ({"prompt_token_ids": [1, 99999]}, "token id 99999 is outside the vocabulary"),
        ({"prompt_token_ids": "abc"}, "prompt_token_ids: must be a list of integers"),
        (42, "prompt: expected a string or a dict"),
    ],
)
def test_bad_prompts(llm, prompt, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(prompt, SamplingParams(max_tokens=4), use_tqdm=False)
    assert serves(llm)


def test_bad_prompt_in_a_batch_leaves_nothing_behind(llm):
    with pytest.raises(ValueError, match="empty"):
        llm.generate(["fine", "", "also fine"], use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    assert serves(llm)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -5}, "top_k"),
        ({"n": 0}, "n"),
        ({"min_p": 2.0}, "min_p"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"stop": [""]}, "stop"),
        ({"logprobs": -1}, "logprobs"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"logit_bias": {"a": 1.0}}, "logit_bias"),
    ],
)
def test_bad_sampling_params(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        SamplingParams(**kwargs)


def test_out_of_vocab_ids_in_params_are_refused_up_front(llm):
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate("hi", SamplingParams(logit_bias={10**6: 1.0}), use_tqdm=False)
    with pytest.raises(ValueError, match="stop_token_ids"):
        llm.generate("hi", SamplingParams(stop_token_ids=[10**6]), use_tqdm=False)
    assert serves(llm)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"block_size": -1}, "block_size"),
        ({"dtype": "int8"}, "dtype"),
        ({"kv_cache_memory_bytes": 10, "num_kv_blocks": 4}, "kv_cache_memory_bytes"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_bad_engine_config(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        EngineConfig(**kwargs)


def test_unknown_engine_argument():
    with pytest.raises(ValueError, match="unknown engine argument"):
        LLM("smollm2", max_num_sequences=3)


def test_unknown_model_name():
    with pytest.raises(ValueError, match="neither a built-in model"):
        LLM("no-such-model")


def test_missing_path(tmp_path):
    with pytest.raises(ValueError, match="neither a built-in model"):
        LLM(str(tmp_path / "nowhere"))


def test_unsupported_architecture_lists_supported(tiny_llama, tmp_path):
    import shutil

    ckpt = tmp_path / "gpt2ish"
    shutil.copytree(tiny_llama, ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match="not supported; supported: .*LlamaForCausalLM.*Qwen3ForCausalLM"
    ):
        LLM(str(ckpt))


def test_truncated_weights_are_named(tiny_llama, tmp_path):
    import shutil

    ckpt = tmp_path / "truncated"
    shutil.copytree(tiny_llama, ckpt)
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors"):
        LLM(str(ckpt))


def test_max_model_len_beyond_the_model(tiny_llama):
    with pytest.raises(ValueError, match="max_model_len"):
        LLM(str(tiny_llama), max_model_len=10**6)


def test_kv_cache_too_small_for_one_request(tiny_llama):
    with pytest.raises(ValueError, match="cannot hold one request"):
        LLM(str(tiny_llama), max_model_len=256, num_kv_blocks=2)
