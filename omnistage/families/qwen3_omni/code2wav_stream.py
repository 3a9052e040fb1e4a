"""`Code2WavStream` and `decode_chunk`: transformers' Qwen3-Omni code2wav
(`Qwen3OmniMoeCode2Wav`) over a stream's chunks, each code frame decoded once.

Every part of the decoder reads only the past, but for the decoder blocks' transposed
convolutions, whose output is cut by `kernel - stride` samples on both sides: a sample
there waits for the next input frame. So each part runs as a streaming operator over
the samples (or frames) that reach it: a causal convolution continues the last
`kernel - 1` inputs it kept (zeros at the start, as the whole decode's padding); a
transposed convolution keeps the input frames whose overlap reaches samples not yet
complete and gives out only the complete ones (the last `kernel - stride` wait for the
next chunk, or are the whole decode's cut at the end); the transformer keeps every
committed frame's keys and values (a transformers `DynamicCache` without sliding-window
layers, so it can be cut back; the model's own mask applies the window); SnakeBeta, the
ConvNeXt blocks' norms and products and the code embedding work per sample. A chunk then
gives the samples that became complete, equal to the whole decode's up to float rounding,
whatever the chunks: together, exactly the whole decode's samples.

A decode never advances a stream in place: `decode_chunk` returns the next
`Code2WavStream` (the cache is cut back to the committed frames on its next use, so a
failed call leaves nothing behind).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Code2WavStream:
    """What a stream's next chunk needs of the frames decoded before it."""

    frames: int = 0
    """Code frames decoded so far (the transformer's next position)."""
    cache: Any = None
    """The transformer's `DynamicCache` (may hold frames past `frames`: cut back first)."""
    tails: dict[int, torch.Tensor] = field(default_factory=dict)
    """Per module (by `id`): the inputs it kept."""
    done: dict[int, int] = field(default_factory=dict)
    """Per transposed convolution: input frames it has seen."""

    def advanced(self) -> Code2WavStream:
        return Code2WavStream(self.frames, self.cache, dict(self.tails), dict(self.done))


def streamable(module: Any) -> bool:
    """Whether every part of `module` is one `decode_chunk` runs as a stream (the released
    layout: stride-1 causal convolutions, transposed ones cut by `kernel - stride`)."""
    for part in module.modules():
        name = type(part).__name__
        if name == "Qwen3OmniMoeCausalConvNet" and part.stride != 1:
            return False
        if name == "Qwen3OmniMoeCausalTransConvNet":
            pad = part.conv.kernel_size[0] - part.conv.stride[0]
            if (part.left_pad, part.right_pad) != (pad, pad) or part.conv.padding[0] != 0:
                return False
    return hasattr(module, "pre_transformer") and hasattr(module, "code_embedding")


def _causal_conv(conv: Any, x: torch.Tensor, stream: Code2WavStream) -> torch.Tensor:
    """A stride-1 causal convolution, continuing its kept inputs."""
    if not conv.padding:
        return conv.conv(x)
    kept = stream.tails.get(id(conv))
    if kept is None:
        kept = x.new_zeros(*x.shape[:-1], conv.padding)
    full = torch.cat([kept, x], -1)
    stream.tails[id(conv)] = full[..., full.shape[-1] - conv.padding :]
    return conv.conv(full)


def _trans_conv(conv: Any, x: torch.Tensor, stream: Code2WavStream) -> torch.Tensor:
    """The transposed convolution's samples that `x`'s frames complete (see the module
    docstring): raw sample `r` is complete once frame `r // stride` is in; the whole
    decode's output `j` is raw `j + left_pad`."""
    stride, kernel = conv.conv.stride[0], conv.conv.kernel_size[0]
    seen = stream.done.get(id(conv), 0)
    kept = stream.tails.get(id(conv))
    full = x if kept is None else torch.cat([kept, x], -1)
    first = seen - (0 if kept is None else kept.shape[-1])  # frame index of full[0]
    now = seen + x.shape[-1]
    keep = math.ceil(kernel / stride) - 1
    if keep:
        stream.tails[id(conv)] = full[..., max(0, full.shape[-1] - keep) :]
    stream.done[id(conv)] = now
    raw = conv.conv(full)  # raw[i] is global raw sample first * stride + i
    start, stop = max(seen * stride, conv.left_pad), now * stride
    if stop <= start:
        return raw[..., :0]
    return raw[..., start - first * stride : stop - first * stride]


def _convnext(block: Any, x: torch.Tensor, stream: Code2WavStream) -> torch.Tensor:
    h = _causal_conv(block.dwconv, x, stream).permute(0, 2, 1)
    h = block.pwconv2(block.act(block.pwconv1(block.norm(h))))
    return x + (block.gamma * h).permute(0, 2, 1)


def _residual_unit(unit: Any, x: torch.Tensor, stream: Code2WavStream) -> torch.Tensor:
    h = _causal_conv(unit.conv1, unit.act1(x), stream)
    return x + _causal_conv(unit.conv2, unit.act2(h), stream)


def _part(part: Any, x: torch.Tensor, stream: Code2WavStream) -> torch.Tensor:
    """One part of the upsampler or the decoder as a streaming operator."""
    name = type(part).__name__
    if x.shape[-1] == 0:
        return x
    if name == "Qwen3OmniMoeCausalConvNet":
        return _causal_conv(part, x, stream)
    if name == "Qwen3OmniMoeCausalTransConvNet":
        return _trans_conv(part, x, stream)
    if name == "Qwen3OmniMoeConvNeXtBlock":
        return _convnext(part, x, stream)
    if name == "Qwen3OmniMoeCode2WavDecoderResidualUnit":
        return _residual_unit(part, x, stream)
    if name == "Qwen3OmniMoeCode2WavDecoderBlock":
        for inner in part.block:
            x = _part(inner, x, stream)
        return x
    if "SnakeBeta" in name:
        return part(x)
    raise ValueError(f"code2wav: no streaming form for {name}")


def decode_chunk(
    module: Any, stream: Code2WavStream, codes: torch.Tensor
) -> tuple[torch.Tensor, Code2WavStream]:
    """`codes` [1, num_quantizers, T], the frames after the stream's -> the samples they
    complete [1, 1, n] and the stream after them."""
    from transformers import DynamicCache

    after = stream.advanced()
    cache = after.cache if after.cache is not None else DynamicCache()
    extra = cache.get_seq_length() - after.frames
    if extra > 0:  # a failed call's frames
        cache.crop(-extra)
    hidden = module.code_embedding(codes + module.code_offset).mean(1)
    positions = torch.arange(after.frames, after.frames + codes.shape[-1], device=codes.device)
    hidden = module.pre_transformer(
        inputs_embeds=hidden, past_key_values=cache, use_cache=True, position_ids=positions[None]
    ).last_hidden_state
    after.cache, after.frames = cache, after.frames + codes.shape[-1]
    x = hidden.permute(0, 2, 1)
    for blocks in module.upsample:
        for block in blocks:
            x = _part(block, x, after)
    for block in module.decoder:
        x = _part(block, x, after)
    return x.clamp(min=-1, max=1), after
