"""`RowBuffer`: append-only rows (along dim 0) whose every prefix is a free view.

A streamed output (a waveform in chunks) grows by appending. Concatenating
everything so far at each chunk copies O(n^2) bytes over a stream of n; this
buffer keeps the rows in one tensor whose capacity doubles when full, so
appending n rows in all copies each row at most ~3 times (once in, and on
average under twice more when the buffer grows): amortized O(n).

`view(length)` is a view of the first `length` rows, made in O(1). The rows
under a view never change afterwards (later appends write past them, growth
copies into a new tensor), so a reader in another thread may hold a view while
the owner appends. `bytes_copied` counts every byte written, for tests.
"""

from __future__ import annotations

import torch


class RowBuffer:
    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self.length = 0
        """Rows appended so far."""
        self.bytes_copied = 0
        """Bytes written since creation (appended rows plus growth copies)."""

    def append(self, rows: torch.Tensor) -> None:
        """Append `rows` ([n, ...], the same trailing shape and dtype as the first rows)."""
        if rows.ndim == 0:
            raise ValueError("output data: expected rows along dim 0, got a scalar tensor")
        if self._buffer is None:
            capacity = max(1, rows.shape[0])  # one chunk (an image) takes no more
            self._buffer = torch.empty((capacity, *rows.shape[1:]), dtype=rows.dtype)
        elif rows.shape[1:] != self._buffer.shape[1:] or rows.dtype != self._buffer.dtype:
            raise ValueError(
                f"output data: a chunk of shape {list(rows.shape)} ({rows.dtype}) does not "
                f"continue rows of shape [*, {', '.join(map(str, self._buffer.shape[1:]))}] "
                f"({self._buffer.dtype})"
            )
        end = self.length + rows.shape[0]
        if end > self._buffer.shape[0]:
            self._grow(end)
        self._buffer[self.length : end].copy_(rows)
        self.bytes_copied += rows.numel() * rows.element_size()
        self.length = end

    def _grow(self, needed: int) -> None:
        old = self._buffer
        capacity = max(needed, 2 * old.shape[0])
        new = torch.empty((capacity, *old.shape[1:]), dtype=old.dtype)
        new[: self.length].copy_(old[: self.length])
        self.bytes_copied += new[: self.length].numel() * new.element_size()
        self._buffer = new  # views of `old` stay valid: they keep it alive

    def view(self, length: int | None = None) -> torch.Tensor | None:
        """The first `length` rows (all so far by default), without copying; None if empty."""
        length = self.length if length is None else length
        buffer = self._buffer  # read after the length: a newer buffer holds those rows too
        if buffer is None or length == 0:
            return None
        return buffer[:length]
