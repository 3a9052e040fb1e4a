"""`MultimodalDecoderInputs`: what a multimodal prompt asks of the decoder besides its
input embeddings (Qwen3-Omni's thinker with images; docs/qwen3_omni_reference.md §2;
GLM-Image's prior, docs/glm_image_prior.md).

- **3-D rotary positions** (mrope): prompt token `i` rotates with the (T, H, W)
  positions `mrope_positions[:, i]`; every later token `i` (0-based over prompt +
  outputs) with `i + rope_delta` in all three rows. The KV slot and the causal mask
  still follow the sequence index `i`.
- **Generated-token positions** (`decode_positions`, GLM-Image): instead of
  `i + rope_delta`, generated token `j` (0-based over outputs, i.e. sequence index
  `L + j` for an `L`-token prompt) rotates with `decode_positions[:, j]`, the image
  grids' (T, H, W) positions the model writes its tokens into; a token past the table
  takes its last column (transformers' batched `generate` pads the table so).
- **Deepstack**: after decoder layer `k` (`k < len(deepstack_embeds)`), row `j` of
  `deepstack_embeds[k]` is added to the hidden state of the `j`-th prompt position
  where `visual_pos_mask` is set.
- **Per-token modality** (`token_modality`, Ming-Omni's `image_gate` / `audio_gate`):
  prompt token `i` is of modality `token_modality[i]`: 0 text, `k > 0` the model's
  `token_modalities[k - 1]` (e.g. 1 image, 2 audio). The runner hands the model the
  modality of every token of a step through the forward context
  (`AttentionMetadata.token_modality`; generated tokens are text).

A request carries one of these from `LLMEngine.add_tokenized_request` through
`Request` and `NewRequestData` (as `MultimodalDecoderData`, tensors as `TensorBlob`)
to the runner's `RequestState`, and it is sent again whole after a preemption, as
prompt embeddings are. Requests with it salt their prefix-cache hashes with
`digest()` (see `Request.cache_salt`): they share KV blocks only with requests
whose embeddings, positions and deepstack features are all equal.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import msgspec
import torch

from omnistage.core.tensor_blob import TensorBlob, blob_to_tensor, tensor_to_blob


class MultimodalDecoderData(msgspec.Struct, kw_only=True):
    """`MultimodalDecoderInputs` on the wire (scheduler -> runner)."""

    mrope_positions: TensorBlob | None = None
    rope_delta: int = 0
    visual_pos_mask: TensorBlob | None = None
    deepstack_embeds: TensorBlob | None = None
    decode_positions: TensorBlob | None = None
    token_modality: TensorBlob | None = None


def _blob(t: torch.Tensor | None) -> TensorBlob | None:
    return None if t is None else tensor_to_blob(t)


def _tensor(b: TensorBlob | None) -> torch.Tensor | None:
    return None if b is None else blob_to_tensor(b)


@dataclass(eq=False)
class MultimodalDecoderInputs:
    """3-D rotary positions and deepstack features of one prompt of `L` tokens."""

    mrope_positions: torch.Tensor | None = None
    """`[3, L]` int64 (T, H, W) rotary positions of the prompt; None: the sequence index."""
    rope_delta: int = 0
    """Rotary position of token `i >= L` (0-based over the sequence) = `i + rope_delta`."""
    visual_pos_mask: torch.Tensor | None = None
    """`[L]` bool: the positions that receive deepstack features."""
    deepstack_embeds: torch.Tensor | None = None
    """`[num_layers_k, visual_pos_mask.sum(), hidden]`: row `j` of `[k]` is added after decoder
    layer `k` to the `j`-th position of `visual_pos_mask`."""
    decode_positions: torch.Tensor | None = None
    """`[3, N]` int64 (T, H, W) rotary position of generated token `j` (0-based over the
    outputs) in column `j`; tokens past column `N - 1` take column `N - 1`. None: `i +
    rope_delta`."""
    token_modality: torch.Tensor | None = None
    """`[L]` int64: the modality of each prompt token (0 text, `k > 0` the model's
    `token_modalities[k - 1]`); None: all text."""
    _digest: bytes | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_encoded_prompt(cls, prompt: Any) -> MultimodalDecoderInputs | None:
        """From an `omnistage.multimodal.EncodedPrompt`; None when the prompt needs neither
        (text / audio only: ordinary positions, no deepstack), so it runs the 1-D path."""
        deepstack = list(prompt.deepstack_embeds)
        modality = getattr(prompt, "token_modality", None)  # encoders without it: text
        if not prompt.uses_mrope and not deepstack and modality is None:
            return None
        return cls(
            mrope_positions=prompt.mrope_positions if prompt.uses_mrope else None,
            rope_delta=int(prompt.rope_delta) if prompt.uses_mrope else 0,
            visual_pos_mask=prompt.visual_pos_mask if deepstack else None,
            deepstack_embeds=torch.stack(deepstack) if deepstack else None,
            token_modality=modality,
        )

    def output_positions(self, first: int, count: int) -> torch.Tensor:
        """`[3, count]` rotary positions of generated tokens `first .. first + count - 1`
        (needs `decode_positions`; columns past the table repeat its last one)."""
        table = self.decode_positions
        index = torch.arange(first, first + count).clamp_(max=table.shape[1] - 1)
        return table[:, index]

    @property
    def num_deepstack_layers(self) -> int:
        return 0 if self.deepstack_embeds is None else self.deepstack_embeds.shape[0]

    def check(
        self,
        num_prompt_tokens: int,
        hidden_size: int,
        max_positions: int,
        num_layers: int,
        supports_mrope: bool,
        supports_deepstack: bool,
        token_modalities: tuple[str, ...] = (),
    ) -> None:
        """ValueError naming what does not fit the prompt or the model."""
        name = "mm_decoder_inputs"
        pos, mask, feats = self.mrope_positions, self.visual_pos_mask, self.deepstack_embeds
        if pos is not None:
            if not supports_mrope:
                raise ValueError(f"{name}: this model does not take 3-D (mrope) positions")
            if not isinstance(pos, torch.Tensor) or pos.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"{name}: mrope_positions must be an integer torch.Tensor")
            if tuple(pos.shape) != (3, num_prompt_tokens):
                raise ValueError(
                    f"{name}: mrope_positions: expected shape (3, {num_prompt_tokens}), "
                    f"got {tuple(pos.shape)}"
                )
            if int(pos.min()) < 0 or int(pos.max()) >= max_positions:
                raise ValueError(f"{name}: mrope_positions must lie in [0, {max_positions})")
            if not isinstance(self.rope_delta, int) or self.rope_delta > 0:
                # Token max_positions - 1 must still have a rotary position in the table.
                raise ValueError(f"{name}: rope_delta must be an integer <= 0")
        elif self.rope_delta != 0:
            raise ValueError(f"{name}: rope_delta without mrope_positions")
        self._check_decode_positions(max_positions, supports_mrope)
        self._check_token_modality(num_prompt_tokens, token_modalities)
        if (mask is None) != (feats is None):
            raise ValueError(f"{name}: visual_pos_mask and deepstack_embeds go together")
        if feats is None:
            return
        if not supports_deepstack:
            raise ValueError(f"{name}: this model does not take deepstack features")
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise ValueError(f"{name}: visual_pos_mask must be a bool torch.Tensor")
        if tuple(mask.shape) != (num_prompt_tokens,):
            raise ValueError(
                f"{name}: visual_pos_mask: expected shape ({num_prompt_tokens},), "
                f"got {tuple(mask.shape)}"
            )
        if not isinstance(feats, torch.Tensor) or not feats.is_floating_point():
            raise ValueError(f"{name}: deepstack_embeds must be a floating-point torch.Tensor")
        n = int(mask.sum())
        if feats.ndim != 3 or feats.shape[1:] != (n, hidden_size) or feats.shape[0] < 1:
            raise ValueError(
                f"{name}: deepstack_embeds: expected shape (layers, {n}, {hidden_size}) "
                f"(visual positions, hidden size), got {tuple(feats.shape)}"
            )
        if feats.shape[0] > num_layers:
            raise ValueError(
                f"{name}: {feats.shape[0]} deepstack layers for a {num_layers}-layer decoder"
            )

    def _check_decode_positions(self, max_positions: int, supports_mrope: bool) -> None:
        name, table = "mm_decoder_inputs: decode_positions", self.decode_positions
        if table is None:
            return
        if not supports_mrope:
            raise ValueError(f"{name}: this model does not take 3-D (mrope) positions")
        if not isinstance(table, torch.Tensor) or table.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{name}: must be an integer torch.Tensor")
        if table.ndim != 2 or table.shape[0] != 3 or table.shape[1] < 1:
            raise ValueError(f"{name}: expected shape (3, N) with N >= 1, got {tuple(table.shape)}")
        if int(table.min()) < 0 or int(table.max()) >= max_positions:
            raise ValueError(f"{name}: positions must lie in [0, {max_positions})")
        if self.rope_delta != 0:
            raise ValueError(f"{name}: give either decode_positions or rope_delta, not both")

    def _check_token_modality(self, num_prompt_tokens: int, names: tuple[str, ...]) -> None:
        name, kinds = "mm_decoder_inputs: token_modality", self.token_modality
        if kinds is None:
            return
        if not names:
            raise ValueError(f"{name}: this model takes no per-token modality")
        if not isinstance(kinds, torch.Tensor) or kinds.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{name}: must be an integer torch.Tensor")
        if tuple(kinds.shape) != (num_prompt_tokens,):
            raise ValueError(
                f"{name}: expected shape ({num_prompt_tokens},), got {tuple(kinds.shape)}"
            )
        if len(kinds) and (int(kinds.min()) < 0 or int(kinds.max()) > len(names)):
            known = ", ".join(f"{i + 1} {n}" for i, n in enumerate(names))
            raise ValueError(f"{name}: values must be 0 (text) or one of {known}")

    def digest(self) -> bytes:
        """A hash of everything here (salts the prefix-cache block hashes)."""
        if self._digest is None:
            h = hashlib.blake2b(digest_size=16)
            h.update(str(self.rope_delta).encode())
            tensors = (self.mrope_positions, self.visual_pos_mask, self.deepstack_embeds)
            if self.decode_positions is not None:  # unchanged digests for inputs without one
                tensors += (self.decode_positions,)
            if self.token_modality is not None:  # the same
                tensors += (b"modality", self.token_modality)
            for t in tensors:
                if t is None or isinstance(t, bytes):
                    h.update(t or b"-")
                    continue
                t = t.detach().cpu().contiguous()
                h.update(f"{t.dtype}{tuple(t.shape)}".encode())
                h.update(t.view(torch.uint8).numpy() if t.numel() else b"")
            self._digest = h.digest()
        return self._digest

    def to_data(self) -> MultimodalDecoderData:
        return MultimodalDecoderData(
            mrope_positions=_blob(self.mrope_positions),
            rope_delta=self.rope_delta,
            visual_pos_mask=_blob(self.visual_pos_mask),
            deepstack_embeds=_blob(self.deepstack_embeds),
            decode_positions=_blob(self.decode_positions),
            token_modality=_blob(self.token_modality),
        )

    @classmethod
    def from_data(
        cls, data: MultimodalDecoderData, device: torch.device, dtype: torch.dtype
    ) -> MultimodalDecoderInputs:
        """The runner's copy: positions, mask and modality on the CPU (step inputs are built there),
        deepstack features on `device` in the model's `dtype`."""
        pos, feats = _tensor(data.mrope_positions), _tensor(data.deepstack_embeds)
        table, kinds = _tensor(data.decode_positions), _tensor(data.token_modality)
        return cls(
            mrope_positions=None if pos is None else pos.long(),
            rope_delta=data.rope_delta,
            visual_pos_mask=_tensor(data.visual_pos_mask),
            deepstack_embeds=None if feats is None else feats.to(device, dtype),
            decode_positions=None if table is None else table.long(),
            token_modality=None if kinds is None else kinds.long(),
        )
