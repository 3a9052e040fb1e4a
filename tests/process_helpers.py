"""Process-table helpers for tests that check nothing is left running (Linux /proc)."""

from __future__ import annotations

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
