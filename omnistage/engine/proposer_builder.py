"""The speculative-decoding side of a runner: the proposer of `speculative_config`'s
method (ngram, draft_model, mtp), with the draft model or MTP module it drives and
their KV caches."""

from __future__ import annotations

import logging
from typing import Any

from omnistage.config import EngineConfig, parse_dtype
from omnistage.engine.kv_sizing import allocate_layer_caches
from omnistage.engine.model_builder import build_model, model_max_len
from omnistage.models.base import CausalLM
from omnistage.models.loader import load_hf_config, resolve_model
from omnistage.models.registry import engine_config, model_class_for
from omnistage.spec_decode.draft_model import DraftModelProposer
from omnistage.spec_decode.mtp import MtpProposer
from omnistage.spec_decode.ngram import NgramProposer

logger = logging.getLogger("omnistage")


def mtp_module(config: EngineConfig, model: CausalLM) -> Any:
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


def load_draft_model(config: EngineConfig, hf_config: Any, platform: Any) -> CausalLM | None:
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


def build_proposer(
    config: EngineConfig,
    draft: CausalLM | None,
    blocks: int,
    platform: Any,
    mtp_target: CausalLM | None = None,
) -> Any:
    """The drafts' proposer of the configured speculative method (None: no speculation):
    `draft` is the draft model of draft_model, `mtp_target` the target holding the MTP
    module of mtp; their KV caches are allocated as `platform` does."""
    spec = config.speculative
    if spec is None:
        return None
    if spec.method == "ngram":
        return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
    if spec.method == "draft_model":
        assert draft is not None  # loaded for this method
        kv_caches = allocate_layer_caches(draft, blocks, config.block_size, draft.dtype, platform)
        return DraftModelProposer(draft, kv_caches)
    if spec.method == "mtp" and mtp_target is not None:
        mtp = mtp_target.mtp
        kv_caches = allocate_layer_caches(
            mtp, blocks, config.block_size, mtp_target.dtype, platform
        )
        return MtpProposer(mtp_target, kv_caches)
    raise ValueError(
        f"speculative_config.method: {spec.method} is not available for {config.model} "
        "(it has no multi-token-prediction layers)"
    )
