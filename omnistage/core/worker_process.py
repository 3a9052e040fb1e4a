"""Starting a model-runner worker process, cheaply.

This module imports nothing heavy (no torch), so a frontend can start the
worker first and import the rest while the worker imports torch and loads
weights. `ProcessExecutor(child=...)` adopts the started worker.
"""

from __future__ import annotations

from typing import Any

from omnistage.child import ChildProcess, start_child

WORKER_MAIN = "omnistage.core.process_executor:worker_main"


def start_runner_worker(factory: str, *args: Any) -> ChildProcess:
    """A worker process whose runner is built by `factory(*args)` ("module:function")."""
    return start_child(WORKER_MAIN, factory, args, name="omnistage model runner worker")
