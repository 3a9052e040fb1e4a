"""Build a runnable stage from an `EngineConfig`: model, KV cache, runner, scheduler, core.

The runner side (`build_runner`) runs in the engine's process or in a worker
process; the scheduler side (`StartingStage.finish`) always in the engine's. The
model itself comes from `model_builder`, the KV cache size from `kv_sizing`, the
speculative-decoding proposer from `proposer_builder`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

from omnistage.child import CHILD_STARTED_AT
from omnistage.config import EngineConfig
from omnistage.core.async_scheduler import AsyncScheduler
from omnistage.core.engine_core import EngineCore
from omnistage.core.executor import InlineExecutor, ThreadExecutor
from omnistage.core.kv_cache_manager import KVCacheManager
from omnistage.core.process_executor import ProcessExecutor
from omnistage.core.scheduler import Scheduler
from omnistage.engine.kv_sizing import allocate_layer_caches, kv_block_bytes, num_kv_blocks
from omnistage.engine.model_builder import build_model, model_max_len, text_hidden_size
from omnistage.engine.proposer_builder import build_proposer, load_draft_model, mtp_module
from omnistage.engine.worker_launch import WORKER_RUNNER, LaunchedWorker, launch_worker
from omnistage.models.loader import (
    ModelFiles,
    load_hf_config,
    load_tokenizer,
    resolve_model,
)
from omnistage.models.parts import select_part
from omnistage.models.registry import engine_config, model_class_for
from omnistage.platforms import platform_for
from omnistage.sample.stage_transitions import StageTransitions
from omnistage.startup_phases import StartupPhases
from omnistage.worker.model_runner import ModelRunner
from omnistage.worker.recurrent import allocate_recurrent_state

logger = logging.getLogger("omnistage")


@dataclass
class BuiltStage:
    config: EngineConfig
    """Resolved config (max_model_len and token budget filled in)."""
    files: ModelFiles
    hf_config: Any
    core: EngineCore
    kv_cache_manager: KVCacheManager


def build_runner(
    config: EngineConfig, files: ModelFiles, hf_config: Any, phases: StartupPhases | None = None
) -> ModelRunner:
    """The runner side of a stage (model, KV cache tensors, runner) for a resolved config.

    Runs in the engine's process, or in the worker process of `ProcessExecutor`.
    `runner.num_kv_blocks` tells the scheduler side how many blocks exist;
    `runner.startup_phases` how long each part of building it took.
    """
    phases = phases or StartupPhases()
    platform = platform_for(config.device)
    platform.configure_threads(config.num_threads, text_hidden_size(hf_config))
    dtype = config.torch_dtype
    model = build_model(
        files,
        hf_config,
        dtype,
        config.max_model_len,
        phases,
        config.keeps_quantized_weights,
        config.quant_activations,
    )
    model = model.to(platform.device)
    mtp = mtp_module(config, model)
    with phases.phase("platform preparation (weight packing)"):
        model = platform.prepare_model(model)
    draft = load_draft_model(config, hf_config, platform)
    block_bytes = kv_block_bytes(model, config.block_size, dtype)
    if draft is not None:  # its keys use the same blocks: a block costs both models' bytes
        block_bytes += kv_block_bytes(draft, config.block_size, draft.dtype)
    if mtp is not None:  # so do the MTP layer's (it has the fields kv_block_bytes reads)
        block_bytes += kv_block_bytes(mtp, config.block_size, dtype)
    blocks = num_kv_blocks(config, block_bytes, platform.kv_cache_bytes(config, model))
    kv_caches, states = _allocate_caches(config, model, blocks, dtype, platform)
    logger.info(
        "KV cache: %d blocks x %d tokens (%.1f MiB)",
        blocks - 1,
        config.block_size,
        blocks * block_bytes / 2**20,
    )
    runner = platform.runner_class(
        model=model,
        kv_caches=kv_caches,
        block_size=config.block_size,
        max_num_reqs=config.max_num_seqs,
        max_model_len=config.max_model_len,
        eos_token_id=eos_token_id(hf_config),
        device=platform.device,
        stage_transitions=_stage_transitions(config, files),
        output_hidden_states=config.output_hidden_states,
        speculative=config.speculative,
        proposer=build_proposer(
            config, draft, blocks, platform, mtp_target=model if mtp is not None else None
        ),
        recurrent_states=states,
        attention_backend=platform.attention_backend,
        step_forward=platform.step_forward(config),
    )
    runner.num_kv_blocks = blocks
    runner.startup_phases = phases.seconds
    return runner


def _allocate_caches(
    config: EngineConfig, model: Any, blocks: int, dtype: Any, platform: Any
) -> tuple[list[Any], Any]:
    """The model's KV cache tensors (as the platform allocates them) and, for a model with
    recurrent layers, its state slots (bound to the model)."""
    kv_caches = allocate_layer_caches(model, blocks, config.block_size, dtype, platform)
    states = None
    if model.has_recurrent_state:
        # With speculation, a scratch state per position of a verification row (k + 1 tokens).
        spec = config.speculative
        states = allocate_recurrent_state(
            model.recurrent_state_shapes(),
            config.max_num_seqs,
            dtype,
            platform.device,
            spec_positions=0 if spec is None else spec.num_speculative_tokens + 1,
        )
        model.bind_recurrent_state(states)
    return kv_caches, states


def resolve_stage_config(config: EngineConfig, files: ModelFiles) -> tuple[EngineConfig, Any]:
    """The stage's HF config (its part, engine view) and the engine config resolved for it
    (max_model_len, token budget, prefix caching). Deterministic: the frontend and a
    worker process that each call it agree."""
    hf_config = load_hf_config(files)
    if config.model_part is not None:
        hf_config = select_part(hf_config, config.model_part)
    hf_config = engine_config(hf_config)
    config = config.resolve_for_model(model_max_len(hf_config))
    return _without_prefix_caching_for_recurrent(config, hf_config), hf_config


def build_worker_runner(config: EngineConfig, files: ModelFiles) -> ModelRunner:
    """The runner factory of a worker process: resolves the config itself, so the worker
    starts before the frontend has read the model's config (they overlap)."""
    phases = StartupPhases()
    phases.add("worker process start and imports", time.time() - CHILD_STARTED_AT)
    with phases.phase("config"):
        config, hf_config = resolve_stage_config(config, files)
    return build_runner(config, files, hf_config, phases)


@dataclass
class StartingStage:
    """A stage whose runner may still be starting in its worker process: the frontend sets
    itself up (tokenizer, detokenizer) from `config`/`files`/`hf_config`, then `finish()`."""

    config: EngineConfig
    files: ModelFiles
    hf_config: Any
    executor: Any

    def finish(self) -> BuiltStage:
        """Wait for the runner; build the KV manager, scheduler and engine core around it."""
        config, executor = self.config, self.executor
        if isinstance(executor, ProcessExecutor):
            executor.wait_ready()
        kv = KVCacheManager(
            executor.num_kv_blocks,
            config.block_size,
            config.max_model_len,
            config.enable_prefix_caching,
        )
        scheduler_class = AsyncScheduler if config.async_scheduling else Scheduler
        core = EngineCore(
            scheduler_class(config, kv), executor, async_scheduling=config.async_scheduling
        )
        return BuiltStage(
            config=config,
            files=self.files,
            hf_config=self.hf_config,
            core=core,
            kv_cache_manager=kv,
        )


def start_stage(config: EngineConfig, launched: LaunchedWorker | None = None) -> StartingStage:
    """Resolve the model and start its runner: in a worker process (started first, so it
    imports torch and loads weights while this process reads configs; or `launched`
    already, see `worker_launch`), or here."""
    if launched is None:
        launched = launch_worker(config)
    files = launched.files if launched is not None else resolve_model(config.model)
    backend = config.resolved_executor_backend
    worker = ProcessExecutor(WORKER_RUNNER, child=launched.child) if launched else None
    try:
        resolved, hf_config = resolve_stage_config(config, files)
        if worker is not None:
            executor: Any = worker
        else:
            runner = build_runner(resolved, files, hf_config)
            executor = ThreadExecutor(runner) if backend == "thread" else InlineExecutor(runner)
    except BaseException:
        if worker is not None:
            worker.shutdown()
        raise
    return StartingStage(config=resolved, files=files, hf_config=hf_config, executor=executor)


def build_stage(config: EngineConfig) -> BuiltStage:
    return start_stage(config).finish()


def _without_prefix_caching_for_recurrent(config: EngineConfig, hf_config: Any) -> EngineConfig:
    """Prefix caching off for models with recurrent layers: a cached KV prefix cannot restore
    the recurrent state a request had after that prefix. Decided from the model class, so the
    scheduler side knows it even when the runner lives in another process."""
    if not config.enable_prefix_caching or not model_class_for(hf_config).has_recurrent_state:
        return config
    logger.info(
        "prefix caching disabled: %s has recurrent state (a cached prefix cannot restore it)",
        model_class_for(hf_config).__name__,
    )
    return dataclasses.replace(config, enable_prefix_caching=False)


def _stage_transitions(config: EngineConfig, files: ModelFiles) -> StageTransitions | None:
    if not config.stage_transitions and not config.stage_budgets:
        return None
    tokenizer = load_tokenizer(files)
    unk = getattr(tokenizer, "unk_token_id", None)

    def token_to_id(token: str) -> int | None:
        token_id = tokenizer.convert_tokens_to_ids(token)
        return (
            None
            if token_id is None or (token_id == unk and token != tokenizer.unk_token)
            else token_id
        )

    return StageTransitions.from_config(
        config.stage_transitions or {}, token_to_id, config.stage_budgets
    )


def eos_token_id(hf_config: Any) -> int | None:
    eos = getattr(hf_config, "eos_token_id", None)
    if isinstance(eos, list):
        return eos[0] if eos else None
    return eos
