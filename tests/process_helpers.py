"""Helpers for tests that start processes: the process table (Linux /proc), to check that
nothing is left running, and a free local port for a server."""

from __future__ import annotations

import socket
from pathlib import Path


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        kids = [c for c, p in parents.items() if p == parent]
        found.update(kids)
        todo += kids
    return found


def alive(pid: int) -> bool:
    """`pid` exists and is not a zombie (an orphan is reparented, not always reaped at once)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (at the time of asking)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
