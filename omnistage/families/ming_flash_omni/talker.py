"""Ming-flash-omni-2.0's talker as an AR stage: a dense Qwen2 LM whose every step writes
one patch of continuous audio latents (inclusionAI/Ming-omni-tts `modeling_bailingmm.py`,
`BailingMMNativeForConditionalGeneration.sample`, the dense branch).

Per step, as the reference runs it:

    z = the LM's last final-normed hidden state (prompt: its last position)
    patch = FlowHead.sample(z, the last `history_patch_size` latent frames)   [P, C]
    stop  = softmax(stop_head(z))[1] > 0.5 and step > 3      (the patch is emitted too)
    next input embedding = aggregator(patch)                  (not a token's embedding)

On our engine: `compute_logits` is the stop head's 2 logits; the model's own `sample()`
returns per row [stop, patch flattened] (`token_codes_are_floats`): the token (1 ends the
request: the part's end id) and the patch, which the runner keeps in the request's
history like a token's codes and feeds back through `feed_back_codes` (the aggregator of
the patch; the token's own embedding is not used). The history of a row is its confirmed
patches only (`SamplingMetadata.output_codes`), so async scheduling, chunked prefill,
batching and recompute see what sync does.

Randomness: the reference samples under one `torch.manual_seed(seed)` stream; here a
patch at output position k uses a CPU generator seeded with the request's seed and
advanced past the draws of patches 0..k-1 (`FlowHead.skip_patch`): a function of (seed,
position) only, and equal to the reference's stream. The request's `temperature` is the
flow head's (the reference's `temperature` argument); the stop decision is greedy.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from omnistage.families.llama.model import Qwen2ForCausalLM
from omnistage.families.ming_flash_omni.flow_head import FlowHead
from omnistage.families.ming_flash_omni.talker_config import SPEAKER_DIM
from omnistage.families.ming_flash_omni.talker_heads import AGGREGATOR_PREFIX, DIT_PREFIX

MIN_STEPS = 4
"""The reference stops only when `step > 3`: the first four patches never end it."""
_GENERATORS = 256
"""Generator states kept (by seed and position) so a patch need not replay the stream."""


class MingFlashTalker(Qwen2ForCausalLM):
    """The talker part of a Ming-flash-omni-2.0 checkpoint (see the module docstring)."""

    architectures = ("OmnistageMingFlashTalker",)
    prefer_model_sampler = True
    token_codes_are_floats = True

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__(config, dtype, max_positions)
        heads = config.heads
        self.dit, self.aggregator = heads.build(dtype)
        self.flow = FlowHead(self.dit, heads.latent_dim, heads.patch_size)
        self.history_frames = heads.history_patch_size
        self.num_token_codes = heads.patch_size * heads.latent_dim
        self.stop_head = nn.Linear(config.hidden_size, 2, bias=True, dtype=dtype)
        self.spk_head = nn.Linear(SPEAKER_DIM, config.hidden_size, bias=True, dtype=dtype)
        for module in (self.dit, self.aggregator, self.stop_head, self.spk_head):
            module.requires_grad_(False)
        self._sampling_hidden: torch.Tensor | None = None
        self._streams: OrderedDict[tuple[int, int], torch.Tensor] = OrderedDict()

    # -- weights ------------------------------------------------------------------------------
    def weight_target(self, hf_name: str) -> tuple[str, int | None] | None:
        if hf_name.startswith(("stop_head.", "spk_head.")):
            return hf_name, None
        if hf_name.startswith(DIT_PREFIX):
            return None if "inv_freq" in hf_name else ("dit." + hf_name[len(DIT_PREFIX) :], None)
        if hf_name.startswith(AGGREGATOR_PREFIX):
            name = hf_name[len(AGGREGATOR_PREFIX) :]
            return None if "inv_freq" in name else ("aggregator." + name, None)
        return super().weight_target(hf_name)

    def expected_weight_names(self) -> set[str]:
        names = set()
        for name in super().expected_weight_names():
            bare = name.removeprefix("model.")
            if bare.startswith(("dit.", "aggregator.", "stop_head.", "spk_head.")):
                prefix, rest = bare.split(".", 1)
                own = {"dit": DIT_PREFIX, "aggregator": AGGREGATOR_PREFIX}.get(prefix)
                names.add(bare if own is None else own + rest)
            else:
                names.add(name)
        return names

    # -- one step ----------------------------------------------------------------------------
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self._sampling_hidden = hidden  # read by sample(), which the runner calls next
        return self.stop_head(hidden).float()

    def feed_back_codes(self, token_embeds: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """The next input is the aggregator of the fed-back patch alone."""
        patches = codes.view(codes.shape[0], self.flow.patch_size, self.flow.latent_dim)
        return self.aggregator(patches)[:, 0]

    def speaker_row(self, embedding: torch.Tensor) -> torch.Tensor:
        """[192] CAM++ speaker embedding -> the [hidden] row the prompt's speaker slot holds."""
        return self.spk_head(embedding.to(self.dtype))

    def sample(self, logits: torch.Tensor, metadata: Any) -> torch.Tensor:
        hidden, self._sampling_hidden = self._sampling_hidden, None
        if hidden is None or hidden.shape[0] != logits.shape[0]:
            raise RuntimeError("MingFlashTalker.sample: compute_logits was not called first")
        rows = []
        for i in range(logits.shape[0]):
            position = metadata.output_positions[i]
            history = self._history(metadata.output_codes[i] or [], position, hidden)
            stream = self._stream(metadata.seeds[i], position)
            patch = self.flow.sample(
                hidden[i].view(1, 1, -1),
                history,
                stream,
                cfg=self.config.cfg_strength,
                sigma=self.config.sigma,
                temperature=float(metadata.sampling_params[i].temperature),
            )
            self._keep_stream(metadata.seeds[i], position + 1, stream)
            stop = position >= MIN_STEPS and bool(logits[i, 1] > logits[i, 0])
            token = torch.tensor([float(stop)], dtype=torch.float64)
            rows.append(torch.cat([token, patch.reshape(-1).to("cpu", torch.float64)]))
        return torch.stack(rows).to(logits.device)

    def _history(self, patches: list[list[float]], position: int, like: torch.Tensor):
        """[1, Hp, C]: the last Hp latent frames of the confirmed patches, zeros before."""
        if len(patches) != position:
            raise RuntimeError(
                f"MingFlashTalker: {len(patches)} patches in the history at output {position}"
            )
        c, hp = self.flow.latent_dim, self.history_frames
        out = torch.zeros(1, hp, c, dtype=like.dtype)
        want = -(-hp // self.flow.patch_size)
        if patches:
            frames = torch.tensor(patches[-want:], dtype=torch.float64).view(-1, c)[-hp:]
            out[0, hp - frames.shape[0] :] = frames.to(like.dtype)
        return out.to(like.device)

    def _stream(self, seed: int, position: int) -> torch.Generator:
        """The request's CPU generator as the reference's stream stands before patch
        `position` (kept states, else replayed from the seed)."""
        g = torch.Generator()
        state = self._streams.pop((seed, position), None)
        if state is not None:
            g.set_state(state)
            return g
        g.manual_seed(seed)
        for _ in range(position):
            self.flow.skip_patch(g)
        return g

    def _keep_stream(self, seed: int, position: int, g: torch.Generator) -> None:
        self._streams[(seed, position)] = g.get_state()
        while len(self._streams) > _GENERATORS:
            self._streams.popitem(last=False)
