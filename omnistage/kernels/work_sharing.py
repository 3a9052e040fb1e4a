"""Threads for the C kernels that share their work through a counter.

Quantized products and decode programs run on the C pool of `decode_program.c`
(`pool_matmul`, `decode_program_run`) with `kernel_threads()` threads; `run` below is
the way of the other work-sharing kernels (decode attention outside a program) and of
products where the pool's library is not built.

A work-sharing kernel takes its last argument as a pointer to an int64
counter (zero at the start) and processes units taken from it until none is
left, so a descheduled thread delays nobody: the others take its share. Each
such kernel has a "team" twin that runs it on an OpenMP team.

Which threads run it (`run`):
- torch computes on several threads: the kernel runs on that same OpenMP
  pool (its threads spin between ops anyway; other threads would compete
  with them for the cores);
- torch computes on one thread (small models, see `platforms`): the caller's
  thread and `num_threads() - 1` helper threads call it at once (ctypes
  releases the GIL). Helpers wait on a queue between calls, which costs no
  CPU — unlike an OpenMP team, whose threads spin after each parallel region
  and would take the core the engine process needs while a step runs under
  asynchronous scheduling.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

_pool: ThreadPoolExecutor | None = None
_num_threads: int | None = None


def available_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def set_num_threads(num_threads: int) -> None:
    """Threads a work-sharing kernel call uses, the caller's included."""
    global _num_threads, _pool
    if num_threads < 1:
        raise ValueError(f"num_threads: must be >= 1, got {num_threads}")
    if num_threads != _num_threads and _pool is not None:
        _pool.shutdown(wait=False)
        _pool = None
    _num_threads = num_threads


def num_threads() -> int:
    return _num_threads if _num_threads is not None else available_cores()


def kernel_threads() -> int:
    """Threads a parallel kernel call runs on: torch's when it computes on several (they
    are awake between ops anyway), else `num_threads()`."""
    torch_threads = torch.get_num_threads()
    return torch_threads if torch_threads > 1 else num_threads()


def run(
    kernel: Callable[..., Any], team: Callable[..., Any], *args: Any, parallel: bool = True
) -> None:
    """Compute `kernel(*args, counter)`: on this thread alone unless `parallel` (the call
    has enough work to pay for waking other threads), else as `team(*args, threads)` on
    torch's pool when it has several threads, else with the helper threads too."""
    global _pool
    counter = ctypes.c_int64(0)
    pointer = ctypes.addressof(counter)
    torch_threads = torch.get_num_threads()
    if parallel and torch_threads > 1:
        team(*args, torch_threads)
        return
    helpers = num_threads() - 1 if parallel else 0
    if helpers == 0:
        kernel(*args, pointer)
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=helpers, thread_name_prefix="omnistage-kernel")
    futures = [_pool.submit(kernel, *args, pointer) for _ in range(helpers)]
    kernel(*args, pointer)
    for future in futures:
        future.result()
