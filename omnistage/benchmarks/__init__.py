"""Benchmarks run as commands (`omnistage bench ...`), never as timed unit tests."""
