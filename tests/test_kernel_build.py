"""The kernel libraries' build: every source compiled (a file per job) and linked into one
library; a source that does not compile leaves no library and the torch path."""

from __future__ import annotations

import ctypes
import logging
import shutil
import threading

import pytest

from omnistage import kernels

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


def test_sources_are_compiled_apart_and_linked_into_one_library(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path / "cache"))
    one, two = tmp_path / "one.c", tmp_path / "two.c"
    one.write_text("int twice(int x) { return 2 * x; }\n")
    two.write_text("int twice(int x);\nint four_times(int x) { return twice(twice(x)); }\n")
    lib = kernels._compiled("libtest.so", [one, two], ("-O2",))
    assert lib is not None
    lib.four_times.restype = ctypes.c_int
    assert lib.four_times(ctypes.c_int(5)) == 20
    (built,) = (tmp_path / "cache" / "kernels").glob("*/libtest.so")
    left = sorted(p.name for p in built.parent.iterdir())
    assert left == ["libtest.so", "libtest.so.lock"]  # no objects left


def test_a_source_that_does_not_compile_gives_none_and_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path / "cache"))
    good, bad = tmp_path / "good.c", tmp_path / "bad.c"
    good.write_text("int one(void) { return 1; }\n")
    bad.write_text("int broken(void) { return }\n")
    with caplog.at_level(logging.WARNING, logger="omnistage"):
        assert kernels._compiled("libbroken.so", [good, bad], ("-O2",)) is None
    assert "building libbroken.so failed" in caplog.text
    assert not list((tmp_path / "cache" / "kernels").glob("*/libbroken.so"))


def test_builders_at_once_build_the_library_once(tmp_path, monkeypatch):
    # A pipeline's stage and worker processes load the kernels at once on a first start:
    # one builds, the others wait on the build lock and load what it built.
    log = tmp_path / "compiles.log"
    wrapper = tmp_path / "cc-logged"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\nsleep 0.2\nexec cc "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    monkeypatch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path / "cache"))
    one, two = tmp_path / "one.c", tmp_path / "two.c"
    one.write_text("int one(void) { return 1; }\n")
    two.write_text("int two(void) { return 2; }\n")
    libs = []

    def build() -> None:
        libs.append(kernels._compiled("libonce.so", [one, two], ("-O2",)))

    builders = [threading.Thread(target=build) for _ in range(3)]
    for b in builders:
        b.start()
    for b in builders:
        b.join()
    assert len(libs) == 3 and all(lib is not None for lib in libs)
    assert len(log.read_text().splitlines()) == 3  # two sources and one link, once
