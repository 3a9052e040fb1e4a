"""Child processes of the engine, launched as our own entry point.

Every process omnistage starts (the async model-runner worker, a pipeline
stage) runs `python -m omnistage.child`, never `multiprocessing`'s spawn, which
re-imports the user's `__main__` in every child: a plain script without an
`if __name__ == "__main__":` guard, `python -c`, code piped to `python -` and
notebooks all work.

    parent                                     child (python -m omnistage.child)
    start_child(fn, *args) ── socketpair ──▶  reads (sys.path, fn, args), pickled
                           ◀── channel ───    fn(*args, channel): the child's own protocol
                           ◀── death note ─   traceback of an exception fn let out, or a
                                              faulthandler dump on a fatal signal

The channel is a `multiprocessing.connection.Connection` both sides own; what
travels on it is the target's business. The death note is a pipe the child
writes only when it fails: `ChildProcess.failure()` gives the parent the
child's own exception (type, message, frames) instead of an exit code.

Children ignore SIGINT: Ctrl-C reaches the whole foreground process group, and
the parent, which owns the children, shuts them down. A child whose parent dies
sees its channel close (the target's loop ends on EOF) or its parent pid change.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import importlib
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

CHILD_STARTED_AT = time.time()
"""When this module was imported: in a child, about when its interpreter started."""
_PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)
NOTE_LIMIT = 64 * 1024
"""Bytes of a death note kept (a traceback; a faulthandler dump of many threads)."""


class ChildError(RuntimeError):
    """An exception raised in a child process, carried back as its formatted traceback."""


class ChildProcess:
    """A running child: its `channel`, its pid, and why it died if it did."""

    def __init__(self, popen: subprocess.Popen, channel: Connection, note_fd: int, name: str):
        self.name = name
        self.channel = channel
        self._popen = popen
        self._note_fd = note_fd
        self._note = b""

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def exitcode(self) -> int | None:
        """None while the child runs; its exit code (negative: killed by that signal) after."""
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self.exitcode is None

    def join(self, timeout: float | None = None) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout)
        return self.exitcode

    def terminate(self) -> None:
        if self.is_alive():
            self._popen.terminate()

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()

    def failure(self, wait_s: float = 2.0) -> str:
        """Why the child died: its own traceback when it left one, else how it ended.

        Waits up to `wait_s` for the child to finish writing and exit (a child
        that reports a failure exits right after)."""
        self._read_note(wait_s)
        self.join(wait_s)
        note = self._note.decode(errors="replace").strip()
        code = self.exitcode
        if code is None:
            how = "is still running"
        elif code < 0:
            how = f"was killed by {_signal_name(-code)}"
        else:
            how = f"exited with code {code}"
        return f"{self.name} (pid {self.pid}) {how}" + (f":\n{note}" if note else "")

    def error(self) -> Exception:
        """The child's failure as an exception to raise in the parent: a `ValueError` the
        child raised stays a `ValueError` (bad user input), with the child's traceback as
        its cause; anything else is a `ChildError`."""
        text = self.failure()
        last = text.strip().splitlines()[-1] if text.strip() else ""
        cause = ChildError(text)
        if last.startswith("ValueError: "):
            err: Exception = ValueError(last.removeprefix("ValueError: "))
            err.__cause__ = cause
            return err
        return cause

    def _read_note(self, wait_s: float) -> None:
        if self._note_fd < 0:
            return
        deadline = wait_s
        while len(self._note) < NOTE_LIMIT:
            ready, _, _ = select.select([self._note_fd], [], [], deadline)
            if not ready:
                return
            chunk = os.read(self._note_fd, 65536)
            if not chunk:  # the child closed it: exited
                os.close(self._note_fd)
                self._note_fd = -1
                return
            self._note += chunk
            deadline = 0.2

    def close(self, timeout: float = 10.0) -> None:
        """Wait up to `timeout` for the child to exit (after the caller asked it to), then
        terminate, then kill it; close our ends."""
        _LIVE.discard(self)
        if self.join(timeout) is None:
            self.terminate()
            if self.join(2.0) is None:
                self.kill()
                self.join()
        self.channel.close()
        if self._note_fd >= 0:
            os.close(self._note_fd)
            self._note_fd = -1

    def __del__(self) -> None:
        popen = getattr(self, "_popen", None)
        if popen is not None and popen.poll() is None:
            popen.kill()


OPENMP_SPINCOUNT = "50000"
"""How long an idle OpenMP thread of a child spins before it sleeps (`GOMP_SPINCOUNT`, for
torch's libgomp and the kernels' alike; read when the library loads), unless the user
set it or `OMP_WAIT_POLICY`. libgomp's default, 300000 spins, kept torch's threads on
the cores between ops, where the kernels' own pool (kernels/decode_program.c) needed
them: a 100-token prefill of the Q4_1 built-in model took 282 ms, 182 ms with this
(docs/performance.md); offline float32 throughput (oneDNN's OpenMP GEMMs) unchanged
within noise (219 against 215 tok/s)."""


def start_child(target: Callable[..., Any] | str, *args: Any, name: str) -> ChildProcess:
    """Run `target(*args, channel)` in a new `python -m omnistage.child` process.

    `target` is a module-level function of an importable module (never one defined in
    `__main__`), or its "module:function" name, which lets a caller start a child
    without importing the target's module itself. `target` and `args` are pickled.
    Returns at once; the child imports and runs while the caller goes on."""
    parent_end, child_end = socket.socketpair()
    note_read, note_write = os.pipe()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH", "")) if p
    )
    if "GOMP_SPINCOUNT" not in env and "OMP_WAIT_POLICY" not in env:
        env["GOMP_SPINCOUNT"] = OPENMP_SPINCOUNT
    command = [sys.executable, "-m", "omnistage.child", str(child_end.fileno()), str(note_write)]
    try:
        popen = subprocess.Popen(
            command,
            pass_fds=(child_end.fileno(), note_write),
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except BaseException:
        parent_end.close()
        os.close(note_read)
        raise
    finally:
        child_end.close()
        os.close(note_write)
    os.set_blocking(note_read, False)
    channel = Connection(parent_end.detach())
    # The path first, on its own: unpickling the call imports the target's module.
    channel.send_bytes(pickle.dumps(list(sys.path)))
    channel.send_bytes(pickle.dumps((target, args)))
    child = ChildProcess(popen, channel, note_read, name)
    _LIVE.add(child)
    return child


_LIVE: weakref.WeakSet[ChildProcess] = weakref.WeakSet()
"""Children started by this process and not yet closed; `_reap_at_exit` ends them."""


@atexit.register
def _reap_at_exit() -> None:
    """At interpreter exit, end every child still running: its owner was never closed
    (a script that just ends, an exception on the way out, SIGTERM)."""
    children = [c for c in list(_LIVE) if c.is_alive()]
    for child in children:
        child.terminate()
    for child in children:
        if child.join(1.0) is None:
            child.kill()
            child.join(1.0)


def exit_on_sigterm() -> None:
    """Make SIGTERM an orderly exit (`SystemExit`) in a program that has not chosen
    what SIGTERM does, so `with` blocks, `finally` and atexit run: children are shut
    down and shared memory is unlinked instead of left behind. Only from the main
    thread, and only over Python's default handler."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_system_exit)


def _raise_system_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _child_main(channel_fd: int, note_fd: int) -> int:
    """The child side: ignore SIGINT, receive the call, run it, leave a note on failure."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    note = os.fdopen(note_fd, "w", buffering=1)
    faulthandler.enable(file=note, all_threads=True)
    channel = Connection(channel_fd)
    try:
        target, args = _receive_call(channel)
        resolve_function(target)(*args, channel)
    except BaseException as exc:  # noqa: BLE001 - the parent is told, then we exit non-zero
        if isinstance(exc, SystemExit) and exc.code in (None, 0):
            return _exit_now(0)
        note.write("".join(traceback.format_exception(exc)))
        note.flush()
        return 1
    return _exit_now(0)


def _exit_now(code: int) -> int:
    """Leave without the interpreter's teardown: the target has released what it held (its
    `finally` blocks ran), and unloading torch and transformers module by module costs
    about a second that a shutting-down pipeline would wait for."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def resolve_function(target: Callable[..., Any] | str) -> Callable[..., Any]:
    """A function given by itself or by its "module:function" name."""
    if callable(target):
        return target
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def _receive_call(channel: Connection) -> tuple[Callable[..., Any], tuple]:
    """The parent's sys.path (set before anything is unpickled), then the call."""
    try:
        path = pickle.loads(channel.recv_bytes())
        sys.path[:] = [*path, *(p for p in sys.path if p not in path)]
        return pickle.loads(channel.recv_bytes())
    except EOFError:  # the parent went away before sending the call
        raise SystemExit(0) from None


if __name__ == "__main__":
    sys.exit(_child_main(int(sys.argv[1]), int(sys.argv[2])))
