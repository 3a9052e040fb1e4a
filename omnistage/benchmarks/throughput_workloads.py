"""The seeded workloads of `omnistage bench throughput`.

- `random`: N prompts of random token ids, L prompt tokens each (or a length drawn from
  LOW-HIGH per prompt);
- `repetitive`: N chat prompts asking to return `DOCUMENT` (a Python module)
  with one small edit from `EDITS` — outputs copy their input, so n-gram lookup
  finds drafts.
"""

from __future__ import annotations

import random
from typing import Any

WORKLOADS = ("random", "repetitive")

DOCUMENT = '''def moving_average(values, window):
    """The mean of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            averages.append(total / window)
    return averages


def running_maximum(values):
    """The largest value seen so far, at each position."""
    result = []
    best = None
    for value in values:
        if best is None or value > best:
            best = value
        result.append(best)
    return result
'''
EDITS = (
    "rename the function moving_average to rolling_mean",
    "rename the variable averages to means",
    "rename the function running_maximum to running_max",
    "rename the variable total to acc",
)


def make_repetitive_workload(tokenizer: Any, num_prompts: int) -> list[list[int]]:
    """Chat prompts asking for the document back with one edit (the model copies it)."""
    prompts = []
    for i in range(num_prompts):
        request = (
            f"Here is a Python module:\n\n{DOCUMENT}\nReturn the whole module with one change: "
            f"{EDITS[i % len(EDITS)]}. Reply with the code only."
        )
        messages = [{"role": "user", "content": request}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    return prompts


def parse_input_len(text: str) -> tuple[int, int]:
    """`--input-len`: "128" (every prompt that long) or "16-300" (lengths drawn uniformly)."""
    parts = str(text).split("-")
    try:
        low, high = int(parts[0]), int(parts[-1])
    except ValueError:
        low = high = 0
    if len(parts) > 2 or low < 1 or high < low:
        raise ValueError(f"--input-len: expected N or LOW-HIGH (1 <= LOW <= HIGH), got {text!r}")
    return low, high


def make_workload(
    num_prompts: int, input_len: tuple[int, int], vocab_size: int, seed: int
) -> list[list[int]]:
    """`num_prompts` prompts of random token ids, each of a length in `input_len` (a fixed
    length draws no lengths, so a fixed-length workload is the same as it always was)."""
    rng = random.Random(seed)
    low, high = min(100, vocab_size // 4), vocab_size - 1
    lengths = [
        input_len[0] if input_len[0] == input_len[1] else rng.randint(*input_len)
        for _ in range(num_prompts)
    ]
    return [[rng.randrange(low, high) for _ in range(n)] for n in lengths]
