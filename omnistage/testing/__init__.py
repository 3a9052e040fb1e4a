"""Helpers for tests and benchmarks: tiny random-weight checkpoints in the real HF layout."""
