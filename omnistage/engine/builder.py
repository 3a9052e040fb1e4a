"""Build a runnable stage from an `EngineConfig`: model, KV cache, runner, scheduler, core.

KV cache size: `num_kv_blocks` if given, else `kv_cache_memory_bytes`, else
enough for `max_num_seqs` requests of `max_model_len` tokens capped at
`DEFAULT_KV_BYTES`. It must hold at least one request of `max_model_len`
tokens, so a lone request can always finish.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from omnistage.child import CHILD_STARTED_AT
from omnistage.config import EngineConfig, parse_dtype
from omnistage.core.async_scheduler import AsyncScheduler
from omnistage.core.engine_core import EngineCore
from omnistage.core.executor import InlineExecutor, ThreadExecutor
from omnistage.core.kv_cache_manager import KVCacheManager
from omnistage.core.process_executor import ProcessExecutor
from omnistage.core.scheduler import Scheduler
from omnistage.engine.worker_launch import WORKER_RUNNER, LaunchedWorker, launch_worker
from omnistage.layers.attention import allocate_kv_cache
from omnistage.models.base import CausalLM
from omnistage.models.gguf_quantized import (
    install_quantized,
    quantized_groups,
    read_quantized_weights,
)
from omnistage.models.loader import (
    ModelFiles,
    iter_weights,
    load_hf_config,
    load_tokenizer,
    resolve_model,
)
from omnistage.models.parts import part_weights, select_part
from omnistage.models.registry import engine_config, model_class_for
from omnistage.platforms import platform_for
from omnistage.sample.stage_transitions import StageTransitions
from omnistage.spec_decode.draft_model import DraftModelProposer
from omnistage.spec_decode.mtp import MtpProposer
from omnistage.spec_decode.ngram import NgramProposer
from omnistage.startup_phases import StartupPhases
from omnistage.worker.model_runner import ModelRunner
from omnistage.worker.recurrent import allocate_recurrent_state

logger = logging.getLogger("omnistage")

DEFAULT_KV_BYTES = 1 << 30


@dataclass
class BuiltStage:
    config: EngineConfig
    """Resolved config (max_model_len and token budget filled in)."""
    files: ModelFiles
    hf_config: Any
    core: EngineCore
    kv_cache_manager: KVCacheManager


def build_model(
    files: ModelFiles,
    hf_config: Any,
    dtype: torch.dtype,
    max_model_len: int,
    phases: StartupPhases | None = None,
    keep_quantized: bool = False,
) -> CausalLM:
    """The model with its weights; with `keep_quantized`, a GGUF's quantized weights stay in
    their blocks (`gguf_quantized`) and only the rest loads as floats."""
    phases = phases or StartupPhases()
    cls = model_class_for(hf_config)
    with phases.phase("model build"):
        model = cls(hf_config, dtype, max_model_len)
    with phases.phase("weights"):
        groups, quantized = [], {}
        if keep_quantized and files.gguf is not None and dtype == torch.float32:
            quantized = read_quantized_weights(files.gguf, hf_config)
            groups = quantized_groups(model, quantized)
        skip = {name for group in groups for name in group.hf_names}
        loaded = model.load_weights(part_weights(iter_weights(files.path, skip=skip), hf_config))
        install_quantized(model, groups, quantized)
    missing = sorted(model.expected_weight_names() - loaded)
    if missing:
        shown = ", ".join(missing[:5]) + (" …" if len(missing) > 5 else "")
        raise ValueError(f"checkpoint {files.path}: {len(missing)} weights missing: {shown}")
    return model.eval()


def model_max_len(hf_config: Any) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(hf_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


def text_hidden_size(hf_config: Any) -> int | None:
    """Hidden size of the (text) decoder the stage runs; None where the config has none."""
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    value = getattr(text, "hidden_size", None)
    return value if isinstance(value, int) else None


def kv_block_bytes(model: CausalLM, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one KV block over the model's attention layers. A model without attention
    layers (Mamba2) still has blocks for the scheduler's accounting: one element per token."""
    elem = torch.empty((), dtype=dtype).element_size()
    layers = model.num_attention_layers
    if layers == 0:
        return block_size * elem
    return 2 * layers * block_size * model.num_kv_heads * model.head_dim * elem


def num_kv_blocks(config: EngineConfig, block_bytes: int) -> int:
    assert config.max_model_len is not None  # resolved before this is called
    per_req = -(-config.max_model_len // config.block_size)
    if config.num_kv_blocks is not None:
        blocks = config.num_kv_blocks
    elif config.kv_cache_memory_bytes is not None:
        blocks = config.kv_cache_memory_bytes // block_bytes
    else:
        blocks = min(config.max_num_seqs * per_req, DEFAULT_KV_BYTES // block_bytes)
    blocks += 1  # the null block
    if blocks - 1 < per_req:
        raise ValueError(
            f"KV cache: {blocks - 1} blocks of {config.block_size} tokens cannot hold one request "
            f"of max_model_len={config.max_model_len}; raise kv_cache_memory_bytes/num_kv_blocks "
            "or lower max_model_len"
        )
    return blocks


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
        files, hf_config, dtype, config.max_model_len, phases, config.keeps_quantized_weights
    )
    model = model.to(platform.device)
    mtp = _mtp_module(config, model)
    with phases.phase("platform preparation (weight packing)"):
        model = platform.prepare_model(model)
    draft = _load_draft_model(config, hf_config, platform)
    block_bytes = kv_block_bytes(model, config.block_size, dtype)
    if draft is not None:  # its keys use the same blocks: a block costs both models' bytes
        block_bytes += kv_block_bytes(draft, config.block_size, draft.dtype)
    if mtp is not None:  # so do the MTP layer's (it has the fields kv_block_bytes reads)
        block_bytes += kv_block_bytes(mtp, config.block_size, dtype)
    blocks = num_kv_blocks(config, block_bytes)
    kv_caches = [
        allocate_kv_cache(
            blocks, config.block_size, model.num_kv_heads, model.head_dim, dtype, platform.device
        )
        for _ in range(model.num_attention_layers)
    ]
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
        proposer=_proposer(
            config, draft, blocks, platform.device, mtp_target=model if mtp is not None else None
        ),
        recurrent_states=states,
    )
    runner.num_kv_blocks = blocks
    runner.startup_phases = phases.seconds
    return runner


def _mtp_module(config: EngineConfig, model: CausalLM) -> Any:
    """The target's MTP module when `speculative_config` asks for method mtp (a ValueError
    when the checkpoint has none); otherwise None, and a loaded one is dropped (unused)."""
    spec = config.speculative
    mtp = getattr(model, "mtp", None)
    if spec is None or spec.method != "mtp":
        if mtp is not None:
            model.mtp = None
        return None
    if mtp is None:
        raise ValueError(
            f"speculative_config.method: mtp is not available for {config.model} "
            "(it has no multi-token-prediction layers)"
        )
    return mtp


def _load_draft_model(config: EngineConfig, hf_config: Any, platform: Any) -> CausalLM | None:
    """The draft model of `speculative_config` method draft_model (None for other methods)."""
    spec = config.speculative
    if spec is None or spec.method != "draft_model":
        return None
    assert spec.model is not None and config.max_model_len is not None  # checked in the config
    files = resolve_model(spec.model)
    draft_config = engine_config(load_hf_config(files))
    if draft_config.vocab_size > hf_config.vocab_size:
        raise ValueError(
            f"speculative_config.model: the draft's vocabulary ({draft_config.vocab_size}) is "
            f"larger than the target's ({hf_config.vocab_size}); it must share the tokenizer"
        )
    if model_max_len(draft_config) < config.max_model_len:
        raise ValueError(
            f"speculative_config.model: the draft's context ({model_max_len(draft_config)}) is "
            f"shorter than max_model_len={config.max_model_len}"
        )
    if model_class_for(draft_config).has_recurrent_state:
        raise ValueError("speculative_config.model: a recurrent draft model is not supported")
    dtype = config.torch_dtype if spec.draft_dtype is None else parse_dtype(spec.draft_dtype)
    draft = build_model(files, draft_config, dtype, config.max_model_len).to(platform.device)
    logger.info("speculative decoding: draft model %s", files.path)
    return platform.prepare_model(draft)


def _proposer(
    config: EngineConfig,
    draft: CausalLM | None,
    blocks: int,
    device: torch.device,
    mtp_target: CausalLM | None = None,
) -> Any:
    """The drafts' proposer of the configured speculative method (None: no speculation):
    `draft` is the draft model of draft_model, `mtp_target` the target holding the MTP
    module of mtp."""
    spec = config.speculative
    if spec is None:
        return None
    if spec.method == "ngram":
        return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
    if spec.method == "draft_model":
        assert draft is not None  # loaded for this method
        kv_caches = [
            allocate_kv_cache(
                blocks, config.block_size, draft.num_kv_heads, draft.head_dim, draft.dtype, device
            )
            for _ in range(draft.num_attention_layers)
        ]
        return DraftModelProposer(draft, kv_caches)
    if spec.method == "mtp" and mtp_target is not None:
        mtp = mtp_target.mtp
        kv_caches = [
            allocate_kv_cache(
                blocks, config.block_size, mtp.num_kv_heads, mtp.head_dim, mtp_target.dtype, device
            )
            for _ in range(mtp.num_attention_layers)
        ]
        return MtpProposer(mtp_target, kv_caches)
    raise ValueError(
        f"speculative_config.method: {spec.method} is not available for {config.model} "
        "(it has no multi-token-prediction layers)"
    )


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
