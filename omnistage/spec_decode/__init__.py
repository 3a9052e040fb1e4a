"""Speculative decoding: proposers of draft tokens and their verification (see config.py)."""

from omnistage.spec_decode.config import SpeculativeConfig

__all__ = ["SpeculativeConfig"]
