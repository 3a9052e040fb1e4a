"""`omnistage verify`'s workload: a seeded, reproducible list of requests.

Each request is a function of (`--seed`, its index) only, so every configuration gets
the very same requests and their outputs are compared by key (`r0`, `r1`, ...). Prompt
lengths are mixed (2-40 words); half the requests are greedy, half sampled at a
temperature > 0 with their own seed: sampling randomness depends only on (seed, output
position), so a seeded request must also come out the same in every configuration.
The second request and a fraction (`ABORT_FRACTION`) of the others are aborted once its first stage has written
`abort_after` tokens; those are never compared, but the engine must end holding
nothing for them.
"""

from __future__ import annotations

import dataclasses
import random

ABORT_FRACTION = 0.25
SIZES = {"short": (4, 4, 12), "full": (32, 8, 48)}
"""Size -> (requests, fewest and most output tokens of a request)."""
_WORDS = str.split(
    "the a of and to in is it that was for on are with as his they be at one have this "
    "from by hot word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would "
    "like so these her long make thing see him two has look more day could go come did "
    "number sound no most people my over know water than call first who may down side"
)


@dataclasses.dataclass(frozen=True)
class VerifyRequest:
    """One request of the workload, the same in every configuration."""

    key: str
    """`r<index>`: names the request's outputs across configurations."""
    prompt: str
    temperature: float
    """0: greedy; > 0: sampled with `seed`."""
    seed: int
    """The request's seed (every sampling stage of a pipeline gets it, greedy or not)."""
    max_tokens: int
    """The output budget (of each `ar` stage of a pipeline, where it is lower than the
    stage's own; see `pipeline_runs.stage_params`)."""
    abort_after: int | None = None
    """Abort once the first stage has written this many tokens (None: never)."""


def make_workload(num_requests: int, seed: int, size: str) -> list[VerifyRequest]:
    """`num_requests` requests drawn from `seed`; `size` (short or full) sets the output
    lengths. The first request is never aborted, so there is always one to compare, and
    the second always is, so there is always an abort."""
    if size not in SIZES:
        raise ValueError(f"size: expected one of {', '.join(SIZES)}, got {size!r}")
    if num_requests < 1:
        raise ValueError(f"requests: must be at least 1, got {num_requests}")
    _, low, high = SIZES[size]
    requests = []
    for i in range(num_requests):
        rng = random.Random(f"verify:{seed}:{i}")
        words = " ".join(rng.choices(_WORDS, k=rng.randint(2, 40)))
        greedy = i % 2 == 0
        abort = None
        if i == 1 or (i > 1 and rng.random() < ABORT_FRACTION):
            abort = rng.randint(1, 3)
        requests.append(
            VerifyRequest(
                key=f"r{i}",
                prompt=words,
                temperature=0.0 if greedy else rng.choice((0.7, 1.0, 1.3)),
                seed=rng.randrange(2**31),
                max_tokens=rng.randint(low, high),
                abort_after=abort,
            )
        )
    return requests
