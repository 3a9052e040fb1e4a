"""Fixtures of the pipeline tests: the tiny three-stage checkpoint, made once per session."""

from __future__ import annotations

import pytest

from omnistage.testing.tiny_pipeline import make_tiny_omni


@pytest.fixture(scope="session")
def tiny_omni(tmp_path_factory):
    return make_tiny_omni(tmp_path_factory.mktemp("tiny-omni"))
