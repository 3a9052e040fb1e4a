"""Start a stage's runner worker before the frontend imports its heavy parts.

`LLM(...)` calls `launch_worker(config)` first: it resolves the model's files
(cheap once cached) and starts the worker process, which imports torch, reads
the config and loads the weights while this process imports the engine and
loads the tokenizer. Importing this module costs no torch and no transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

from omnistage.child import ChildProcess
from omnistage.config import EngineConfig
from omnistage.core.worker_process import start_runner_worker
from omnistage.models.loader import ModelFiles, resolve_model

WORKER_RUNNER = "omnistage.engine.builder:build_worker_runner"


@dataclass
class LaunchedWorker:
    """A runner worker started for `files`; `start_stage` adopts it."""

    files: ModelFiles
    child: ChildProcess


def launch_worker(config: EngineConfig) -> LaunchedWorker | None:
    """Start the runner worker of `config` now if its runner lives in a worker process."""
    if config.resolved_executor_backend != "process":
        return None
    files = resolve_model(config.model)
    return LaunchedWorker(files, start_runner_worker(WORKER_RUNNER, config, files))
