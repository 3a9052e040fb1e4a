"""The sampling pipeline: per-step metadata, logits processors, the default sampler.

The model runner calls, per step (DESIGN.md §5):

1. `compute_logprobs(logits, md)` when `md.max_num_logprobs is not None` (raw logprobs);
2. `apply_logits_processors(logits, md)` (logit bias, min-tokens, penalties; in place);
3. a model's own `sample()` if it prefers one, else `Sampler()(logits, md)`;
4. `gather_logprobs(raw_logprobs, sampled, md.max_num_logprobs)` when logprobs were asked.

Sampling randomness depends only on each row's (seed, output position).
"""

from omnistage.sample.logits_processors import (
    apply_logit_bias,
    apply_logits_processors,
    apply_min_tokens,
    apply_penalties,
)
from omnistage.sample.metadata import SAMPLING_EPS, RowSamplingState, SamplingMetadata
from omnistage.sample.sampler import (
    LogprobsTensors,
    Sampler,
    compute_logprobs,
    gather_logprobs,
    row_seed,
)

__all__ = [
    "SAMPLING_EPS",
    "LogprobsTensors",
    "RowSamplingState",
    "Sampler",
    "SamplingMetadata",
    "apply_logit_bias",
    "apply_logits_processors",
    "apply_min_tokens",
    "apply_penalties",
    "compute_logprobs",
    "gather_logprobs",
    "row_seed",
]
