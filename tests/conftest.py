"""Shared fixtures: tiny checkpoints (session-scoped) and engine factories."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from omnistage.models.tiny_checkpoints import make_checkpoint  # noqa: E402


def pytest_sessionstart(session):
    """The C kernel libraries built once, before any test: built on first use instead,
    both test workers and the child processes of the tests that time a shutdown compile
    them at once (~8 s), and a child compiling when its signal comes exits late."""
    if hasattr(session.config, "workerinput"):
        return  # a test worker: the controller built them before starting it
    from omnistage import kernels

    kernels.load()
    kernels.load_quant()


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2")


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("tiny-qwen3"), "qwen3")


@pytest.fixture(scope="session")
def tiny_qwen3_moe(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("tiny-qwen3-moe"), "qwen3_moe")


@pytest.fixture(scope="session")
def tiny_qwen2_moe(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("tiny-qwen2-moe"), "qwen2_moe")


@pytest.fixture(scope="session")
def tiny_llama_f64(tmp_path_factory):
    """A float64-saved llama for exact equivalence tests."""
    import torch

    return make_checkpoint(
        tmp_path_factory.mktemp("tiny-llama-f64"), "llama", seed=1, dtype=torch.float64
    )


@pytest.fixture(scope="session")
def tiny_mamba2(tmp_path_factory):
    """A float64-saved Mamba2 (recurrent state, no attention) for exact parity tests."""
    import torch

    return make_checkpoint(
        tmp_path_factory.mktemp("tiny-mamba2"), "mamba2", seed=1, dtype=torch.float64
    )


@pytest.fixture(scope="session")
def tiny_qwen3_next(tmp_path_factory):
    """A float64-saved Qwen3-Next (gated delta-net + gated attention + MoE)."""
    import torch

    return make_checkpoint(
        tmp_path_factory.mktemp("tiny-qwen3-next"), "qwen3_next", seed=1, dtype=torch.float64
    )


@pytest.fixture(scope="session")
def tiny_qwen3_5(tmp_path_factory):
    """A float64-saved Qwen3.5 text model (gated delta-net + gated attention, dense MLP)."""
    import torch

    return make_checkpoint(
        tmp_path_factory.mktemp("tiny-qwen3-5"), "qwen3_5", seed=1, dtype=torch.float64
    )
