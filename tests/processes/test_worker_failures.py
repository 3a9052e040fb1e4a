"""A worker or stage that fails says why: the child's own exception, not an exit code."""

from __future__ import annotations

import os
import signal

import pytest
import safetensors.torch

from omnistage import LLM, SamplingParams
from omnistage.child import ChildError
from omnistage.core.process_executor import RunnerFailed


def _drop_a_weight(checkpoint, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in checkpoint.iterdir():
        if f.suffix != ".safetensors":
            (broken / f.name).write_bytes(f.read_bytes())
    tensors = safetensors.torch.load_file(checkpoint / "model.safetensors")
    tensors.pop("model.norm.weight")
    safetensors.torch.save_file(tensors, broken / "model.safetensors")
    return broken


def test_a_worker_that_fails_at_start_raises_its_own_error_with_its_frames(tiny_llama, tmp_path):
    broken = _drop_a_weight(tiny_llama, tmp_path)
    with pytest.raises(ValueError, match="weights missing: model.norm.weight") as info:
        LLM(model=str(broken), async_scheduling=True)
    cause = info.value.__cause__
    assert isinstance(cause, ChildError)
    assert "builder.py" in str(cause) and "build_model" in str(cause)  # the child's frame


def test_a_worker_killed_mid_run_names_the_signal(tiny_llama):
    llm = LLM(model=str(tiny_llama), async_scheduling=True)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    assert llm.generate({"prompt_token_ids": [1, 2, 3]}, params, use_tqdm=False)
    worker = llm.engine.core.executor.child
    os.kill(worker.pid, signal.SIGKILL)
    with pytest.raises(RunnerFailed, match="killed by SIGKILL"):
        llm.generate({"prompt_token_ids": [1, 2, 3]}, params, use_tqdm=False)
    llm.engine.core.executor.shutdown()


def test_a_stage_that_fails_at_start_raises_its_traceback(tmp_path):
    from omnistage.pipeline.omni import Omni
    from omnistage.testing.tiny_pipeline import make_tiny_omni, tiny_pipeline_deploy

    # One KV block cannot hold one request: the thinker's stage process fails at start.
    deploy = tiny_pipeline_deploy(make_tiny_omni(tmp_path), ar_engine_args={"num_kv_blocks": 1})
    with pytest.raises(ChildError) as info:
        Omni(deploy)
    text = str(info.value)
    assert "failed to start" in text and "KV cache" in text
    assert "builder.py" in text  # the stage process's own frames
