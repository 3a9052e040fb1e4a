"""`DecodeGraphs`: decode steps replayed from CUDA graphs, one captured per batch size.

A step of decodes launches a few hundred small kernels; on a GPU the host's time to
launch them is most of the step at small batches. Captured once per size in
`capture_sizes`, a step of `n` decodes copies its token ids, positions, cache slots,
block table and context lengths into the graphs' static buffers, replays the graph of
the smallest captured size >= n (padded rows decode token 0 at position 0 into the
null block's slot 0, which no request reads) and returns the first n rows of its output.

Only plain decode steps replay: every scheduled row one token id, 1-D positions, no
input embeddings, recurrent state, per-token modalities or drafts, a batch within the
largest size. Everything else (prefill chunks, speculative verification, multimodal
rows) runs eagerly, as does every step of a model whose forward cannot be captured
(a capture error turns the graphs off for that runner, with a warning).
"""

from __future__ import annotations

import logging

import torch

from omnistage.layers.attention import AttentionMetadata
from omnistage.layers.attention_backend import AttentionBackend
from omnistage.layers.forward_context import forward_context
from omnistage.models.base import CausalLM
from omnistage.worker.step_forward import eager_forward
from omnistage.worker.step_inputs import StepInputs

logger = logging.getLogger("omnistage")

CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
"""Batch sizes captured (those up to `max_num_seqs`, and `max_num_seqs` itself up to 512)."""


def capture_sizes(max_num_seqs: int) -> list[int]:
    top = min(max_num_seqs, CAPTURE_SIZES[-1])
    return [s for s in CAPTURE_SIZES if s < top] + [top]


class DecodeGraphs:
    """The CUDA platform's `StepForward`: decode steps from captured graphs, the rest eager."""

    def __init__(
        self,
        max_num_seqs: int,
        max_blocks: int,
        device: torch.device,
        backend: AttentionBackend,
    ) -> None:
        self.sizes = capture_sizes(max_num_seqs)
        self.backend = backend
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.disabled = False
        top, i64 = self.sizes[-1], dict(dtype=torch.int64, device=device)
        self.input_ids = torch.zeros(top, **i64)
        self.positions = torch.zeros(top, **i64)
        self.slots = torch.zeros(top, **i64)
        self.token_idx = torch.arange(top, **i64)
        self.block_table = torch.zeros(top, max_blocks, **i64)
        self.seq_lens = torch.ones(top, **i64)
        self.replays = 0
        """Steps served from a graph (telemetry, and what the tests check)."""

    def __call__(
        self,
        model: CausalLM,
        inputs: StepInputs,
        embeds: torch.Tensor | None,
        deepstack: torch.Tensor | None,
    ) -> torch.Tensor:
        n = inputs.input_ids.shape[0]
        if self.disabled or not self._replayable(inputs, embeds, deepstack):
            return eager_forward(model, inputs, embeds, deepstack)
        if not self.graphs:
            self._capture(model)
            if self.disabled:
                return eager_forward(model, inputs, embeds, deepstack)
        size = next(s for s in self.sizes if s >= n)
        self._load(inputs, n, size)
        graph, hidden = self.graphs[size]
        graph.replay()
        self.replays += 1
        return hidden[:n]

    def _replayable(
        self, inputs: StepInputs, embeds: torch.Tensor | None, deepstack: torch.Tensor | None
    ) -> bool:
        attn = inputs.attn
        return (
            attn.all_decode
            and embeds is None
            and deepstack is None
            and not inputs.drafts
            and attn.recurrent is None
            and attn.token_modality is None
            and inputs.positions.dim() == 1
            and inputs.input_ids.shape[0] <= self.sizes[-1]
            and attn.decode_block_table.shape[1] <= self.block_table.shape[1]
        )

    def _load(self, inputs: StepInputs, n: int, size: int) -> None:
        attn = inputs.attn
        self.input_ids[:n].copy_(inputs.input_ids)
        self.positions[:n].copy_(inputs.positions)
        self.slots[:n].copy_(attn.slot_mapping)
        self.block_table[:n, : attn.decode_block_table.shape[1]].copy_(attn.decode_block_table)
        self.seq_lens[:n].copy_(attn.decode_seq_lens)
        if size > n:  # padded rows: token 0 at position 0, into the null block
            self.input_ids[n:size].zero_()
            self.positions[n:size].zero_()
            self.slots[n:size].zero_()
            self.seq_lens[n:size].fill_(1)

    def _metadata(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            num_tokens=size,
            slot_mapping=self.slots[:size],
            decode_token_idx=self.token_idx[:size],
            decode_block_table=self.block_table[:size],
            decode_seq_lens=self.seq_lens[:size],
            prefills=[],
            all_decode=True,
            backend=self.backend,
        )

    def _capture(self, model: CausalLM) -> None:
        """A graph per size, largest first, all in one memory pool; each size is run once
        eagerly first (kernels compiled and tuned outside the capture)."""
        pool = None
        try:
            for size in reversed(self.sizes):
                self.seq_lens[:size].fill_(1)
                with forward_context(self._metadata(size)):
                    model(self.input_ids[:size], self.positions[:size], None)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                # thread_local: the other stages of an in-process pipeline (threads of this
                # process) go on launching their own work while this stage captures.
                capture = torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local")
                with capture, forward_context(self._metadata(size)):
                    hidden = model(self.input_ids[:size], self.positions[:size], None)
                pool = graph.pool()
                self.graphs[size] = (graph, hidden)
        except Exception as error:  # any failure to capture: the eager path stays correct
            logger.warning(
                "decode steps run eagerly: the model's forward could not be captured (%s)", error
            )
            self.graphs.clear()
            self.disabled = True
        torch.cuda.synchronize()
