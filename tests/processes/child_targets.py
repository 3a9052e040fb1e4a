"""Functions the child-process tests run in `python -m omnistage.child` processes."""

from __future__ import annotations

import ctypes
from multiprocessing.connection import Connection


def echo(prefix: str, channel: Connection) -> None:
    """Answer every message with `prefix` + it, until the parent closes the channel."""
    while True:
        try:
            message = channel.recv_bytes()
        except EOFError:
            return
        channel.send_bytes(prefix.encode() + message)


def fail_with_runtime_error(channel: Connection) -> None:
    raise RuntimeError("boom from the child")


def fail_with_value_error(channel: Connection) -> None:
    raise ValueError("max_model_len: too large for this child")


def crash_with_segfault(channel: Connection) -> None:
    ctypes.string_at(0)


def exit_quietly(code: int, channel: Connection) -> None:
    raise SystemExit(code)
