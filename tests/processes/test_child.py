"""`omnistage.child`: children run our entry point and report why they died."""

from __future__ import annotations

import os
import signal
import time

import pytest

from omnistage.child import ChildError, start_child
from tests.process_helpers import alive
from tests.processes import child_targets


def test_a_child_runs_the_target_and_talks_on_its_channel():
    child = start_child(child_targets.echo, "re: ", name="echo child")
    child.channel.send_bytes(b"hello")
    assert child.channel.recv_bytes() == b"re: hello"
    child.channel.close()  # EOF: the target returns, the child exits 0
    assert child.join(30) == 0
    child.close()


def test_a_target_named_by_string_runs_without_the_parent_importing_it():
    child = start_child("tests.processes.child_targets:echo", ">", name="echo child")
    child.channel.send_bytes(b"x")
    assert child.channel.recv_bytes() == b">x"
    child.close(timeout=0)
    assert not child.is_alive()


def test_an_exception_in_the_child_reaches_the_parent_with_its_frames():
    child = start_child(child_targets.fail_with_runtime_error, name="failing child")
    assert child.join(30) == 1
    error = child.error()
    assert isinstance(error, ChildError)
    text = str(error)
    assert "RuntimeError: boom from the child" in text
    assert "child_targets.py" in text and "fail_with_runtime_error" in text
    assert "failing child" in text and "exited with code 1" in text
    child.close()


def test_a_value_error_in_the_child_stays_a_value_error():
    child = start_child(child_targets.fail_with_value_error, name="child")
    child.join(30)
    error = child.error()
    assert isinstance(error, ValueError)
    assert str(error) == "max_model_len: too large for this child"
    assert "fail_with_value_error" in str(error.__cause__)
    child.close()


def test_a_child_killed_by_a_fatal_signal_says_so_with_its_python_stack():
    child = start_child(child_targets.crash_with_segfault, name="crashing child")
    child.join(30)
    text = child.failure()
    assert "SIGSEGV" in text
    assert "Fatal Python error" in text and "crash_with_segfault" in text  # faulthandler
    child.close()


def test_a_killed_child_names_the_signal():
    child = start_child(child_targets.echo, "", name="victim")
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    assert "killed by SIGKILL" in child.failure()
    child.close()


def test_a_quiet_exit_leaves_no_note():
    child = start_child(child_targets.exit_quietly, 0, name="quiet child")
    assert child.join(30) == 0
    assert child.failure().endswith("exited with code 0")
    child.close()


def test_children_ignore_sigint_the_parent_owns_them():
    child = start_child(child_targets.echo, "", name="child")
    child.channel.send_bytes(b"up")
    assert child.channel.recv_bytes() == b"up"  # the child has installed its handlers
    os.kill(child.pid, signal.SIGINT)
    time.sleep(0.3)
    assert child.is_alive()
    child.close(timeout=0)
    assert not child.is_alive()


@pytest.mark.parametrize("form", ["close", "gc"])
def test_a_dropped_child_is_ended(form):
    child = start_child(child_targets.echo, "", name="child")
    pid = child.pid
    if form == "close":
        child.close(timeout=0)
    else:
        child.channel.close()  # the target sees EOF and returns
        del child
    deadline = time.monotonic() + 30
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ({}, ("50000", None)),
        ({"GOMP_SPINCOUNT": "7"}, ("7", None)),
        ({"OMP_WAIT_POLICY": "active"}, (None, "active")),
    ],
)
def test_children_spin_briefly_in_openmp_unless_the_user_said(monkeypatch, user, expected):
    """A child's OpenMP threads sleep after ~50000 spins (libgomp's 300000 held the cores
    the kernels' pool needed); a user's GOMP_SPINCOUNT or OMP_WAIT_POLICY is left alone."""
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in user.items():
        monkeypatch.setenv(name, value)
    child = start_child(child_targets.report_openmp_env, name="openmp child")
    assert child.channel.recv() == expected
    assert child.join(30) == 0
    child.close()
