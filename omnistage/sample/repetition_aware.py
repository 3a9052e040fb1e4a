"""Repetition-aware sampling (RAS): CosyVoice's `ras_sampling`, for speech-token LMs.

A speech LM sampled with a tight nucleus falls into loops (the same token over and over,
heard as a stuck syllable or a hum). RAS samples as usual — the nucleus of CosyVoice's
`nucleus_sampling`: top-p of the whole distribution, then at most top-k of it
(`Sampler(top_p_first=True)`) — and when the token it drew already occurs at least
`window * tau_r` times among the row's last `window` output tokens, draws again from
the whole distribution (temperature only, no filters). The reference's settings
(CosyVoice2 and 3 `llm.sampling`): top-p 0.8, top-k 25, window 10, tau_r 0.1 — a
token seen once in the last 10 is redrawn.

The redraw's randomness is a second stream of the row's seed (`RESAMPLE_SALT`), at the
same output position, so it depends on nothing but (seed, position) like every draw of
the default sampler: a row samples the same alone or batched, sync or async. The history
is the row's real output tokens (the sampling dispatch never hands a model sampler a
placeholder). Greedy rows are left as they are (argmax has nothing to redraw).
"""

from __future__ import annotations

import torch

from omnistage.sample.metadata import SAMPLING_EPS, SamplingMetadata
from omnistage.sample.sampler import Sampler, row_seed

RAS_WINDOW = 10
RAS_TAU_R = 0.1
RESAMPLE_SALT = 0x5241535F52455341  # "RAS_RESA": the redraw's stream of a row's seed


class RepetitionAwareSampler:
    """Samples like `Sampler(top_p_first=True)`, redrawing repeats (see the module)."""

    def __init__(self, window: int = RAS_WINDOW, tau_r: float = RAS_TAU_R) -> None:
        if window < 1 or tau_r <= 0:
            raise ValueError(f"RAS: window >= 1 and tau_r > 0 needed, got {window}, {tau_r}")
        self.window = window
        self.limit = window * tau_r
        """A drawn token seen at least this often in the window is redrawn."""
        self.sampler = Sampler(top_p_first=True)

    def __call__(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """One token per row of `logits` [B, V]; returns [B] int64. Does not modify
        `logits`."""
        tokens = self.sampler(logits, md)
        if md.all_greedy:
            return tokens
        drawn = tokens.tolist()
        rows = [
            r
            for r in range(md.num_rows)
            if float(md.temperature[r]) >= SAMPLING_EPS
            and md.output_token_ids[r][-self.window :].count(drawn[r]) >= self.limit
        ]
        if rows:
            tokens[rows] = self._redraw(logits, md, rows)
        return tokens

    def _redraw(self, logits: torch.Tensor, md: SamplingMetadata, rows: list[int]) -> torch.Tensor:
        """Rows `rows` drawn from their whole distribution at their temperature."""
        index = torch.tensor(rows, device=logits.device)
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        temperature = md.temperature[rows].to(device=logits.device, dtype=dtype)
        probs = torch.softmax(logits[index].to(dtype) / temperature.unsqueeze(1), dim=-1)
        keys = [(row_seed(md.seeds[r], RESAMPLE_SALT), md.output_positions[r]) for r in rows]
        return Sampler.race(probs, keys)
