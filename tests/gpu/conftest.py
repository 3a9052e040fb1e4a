"""Tests that run on a CUDA device (`gpu` marker): skipped where torch sees none. They run
on the device machine (`python -m pytest -m gpu tests/gpu`; docs/cuda.md)."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
