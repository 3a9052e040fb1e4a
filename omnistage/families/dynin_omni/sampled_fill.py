"""Dynin-Omni's two sampled mask-filling loops, each drawing from one per-request
`torch.Generator` (seeded by the generation stage), so a request's tokens depend on its
seed, prompt and weights only, never on its neighbours:

- `maskgit_image`: text-to-image, as the reference's `t2i_generate` (MaskGIT): every step
  samples every image position from its softmax over the image codes, keeps what is
  already known, and re-masks the `mask_len` least confident positions (log-probability
  plus annealed Gumbel noise), `mask_len` following a cosine schedule;
- `speech_units`: text-to-speech units, as the reference's `t2s_generate_mmu_like`:
  block by block, each step samples the block's positions over the speech units, <|eoa|>
  and the end of text, and keeps the most probable samples (the block's masks spread
  evenly over its steps). With `cfg_scale` > 0 each step also runs the sequence with its
  whole speech region masked again (the reference's unconditional branch, in the same
  batch) and takes `uncond + (cfg_scale + 1) * (cond - uncond)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from omnistage.families.dynin_omni.unmask import transfer_counts

Logits = Callable[[torch.Tensor], torch.Tensor]


def _gumbel(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    noise = torch.zeros_like(t).uniform_(0, 1, generator=generator)
    inner = (-torch.log(noise.clamp(min=1e-20))).clamp(min=1e-20)
    return -torch.log(inner)


def _mask_by_random_topk(
    mask_len: torch.Tensor, probs: torch.Tensor, temperature: float, generator: torch.Generator
) -> torch.Tensor:
    confidence = torch.log(probs.clamp(min=1e-20)) + temperature * _gumbel(probs, generator)
    cut_off = torch.gather(torch.sort(confidence, dim=-1).values, 1, mask_len.long())
    return confidence < cut_off


def maskgit_image(
    logits_fn: Logits,
    ids: torch.Tensor,
    *,
    num_codes: int,
    code_start: int,
    codebook_size: int,
    mask_id: int,
    steps: int,
    temperature: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """The image codes (relative) for `ids` (1-D) whose last `num_codes + 1` positions are
    the masked codes and <|eoi|>."""
    x = ids.clone()[None]
    region = slice(x.shape[1] - num_codes - 1, x.shape[1] - 1)
    known = x[:, region].clone()
    known = torch.where(known == mask_id, known, known - code_start)
    sampled = known
    for step in range(steps):
        logits = logits_fn(x)[:, region, code_start : code_start + codebook_size]
        probs = logits.softmax(dim=-1)
        draws = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator)
        unknown = known == mask_id
        sampled = torch.where(unknown, draws[:, 0].view(*logits.shape[:-1]), known)
        ratio = 1.0 * (step + 1) / steps
        mask_ratio = torch.cos(torch.tensor(ratio) * math.pi * 0.5)
        chosen = torch.gather(probs, -1, sampled.long()[..., None]).squeeze(-1)
        chosen = torch.where(unknown, chosen, torch.finfo(chosen.dtype).max)
        mask_len = (num_codes * mask_ratio).floor().unsqueeze(0)
        mask_len = torch.max(
            torch.tensor([1]), torch.min(unknown.sum(-1, keepdim=True) - 1, mask_len)
        )
        temperature = temperature * (1.0 - ratio)
        masking = _mask_by_random_topk(mask_len, chosen, temperature, generator)
        x[:, region] = torch.where(masking, mask_id, sampled + code_start)
        known = torch.where(masking, mask_id, sampled)
    return sampled[0]


def speech_units(
    logits_fn: Logits,
    ids: torch.Tensor,
    start: int,
    length: int,
    *,
    unit_start: int,
    num_units: int,
    eoa_id: int,
    eos_id: int,
    mask_id: int,
    block_length: int,
    steps: int,
    generator: torch.Generator,
    cfg_scale: float = 0.0,
) -> torch.Tensor:
    """The speech units (relative) written into `ids[start : start + length]` (all masks),
    cut before the first <|eoa|> or end of text."""
    work = ids.clone()[None]
    block_length = max(1, min(block_length, length))
    num_blocks = math.ceil(length / block_length)
    inner_steps = max(1, steps // num_blocks)
    for b in range(num_blocks):
        cols = torch.arange(start + b * block_length, start + min((b + 1) * block_length, length))
        for k in transfer_counts(int((work[0, cols] == mask_id).sum()), inner_steps):
            block = work[0, cols]
            masked = block == mask_id
            logits = _guided(logits_fn, work, start, length, mask_id, cfg_scale)
            logits = logits.index_select(0, cols)
            combined = torch.cat(
                [
                    logits[:, unit_start : unit_start + num_units],
                    logits[:, [eoa_id]],
                    logits[:, [eos_id]],
                ],
                dim=-1,
            )
            probs = torch.softmax(combined, dim=-1)
            drawn = torch.multinomial(probs, 1, generator=generator)[:, 0]
            chosen = probs.gather(-1, drawn[:, None])[:, 0]
            absolute = torch.where(
                drawn == num_units + 1,
                eos_id,
                torch.where(drawn == num_units, eoa_id, drawn + unit_start),
            )
            conf = torch.where(masked, chosen, torch.full_like(chosen, float("-inf")))
            take = min(k, int(masked.sum()))
            keep = torch.zeros_like(masked)
            if take > 0:
                keep[torch.topk(conf, k=take, largest=True).indices] = True
            work[0, cols] = torch.where(masked, torch.where(keep, absolute, mask_id), block)
            if not bool((work[0, cols] == mask_id).any()):
                break
    return _relative_units(
        work[0, start : start + length], unit_start, num_units, eoa_id, eos_id, mask_id
    )


def _guided(
    logits_fn: Logits, work: torch.Tensor, start: int, length: int, mask_id: int, scale: float
) -> torch.Tensor:
    """The sequence's logits, classifier-free guided against its speech region all masked."""
    if scale <= 0.0:
        return logits_fn(work)[0]
    uncond = work.clone()
    uncond[:, start : start + length] = mask_id
    cond, unguided = logits_fn(torch.cat([work, uncond])).chunk(2, dim=0)
    return (unguided + (scale + 1.0) * (cond - unguided))[0]


def _relative_units(
    region: torch.Tensor, unit_start: int, num_units: int, eoa: int, eos: int, mask_id: int
) -> torch.Tensor:
    rel = torch.where(
        region == mask_id,
        mask_id,
        torch.where(
            region == eoa, num_units, torch.where(region == eos, num_units + 1, region - unit_start)
        ),
    )
    ends = (rel >= num_units).nonzero()
    if ends.numel():
        rel = rel[: int(ends[0])]
    return rel[rel != mask_id]
