"""Where the seconds before the first token go: named phases of starting a stage.

`StartupPhases` records how long each phase took (seconds, in order); the
builder times the runner side with it (config, model build, weights,
platform preparation, KV cache), a worker process adds how long it took to
import and to receive its call, and `omnistage bench startup` prints them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class StartupPhases:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
