"""Unit tests start no process: every way Python starts one raises while a unit test's setup, call
or teardown runs, so a unit test that starts one fails, naming the call. Tests that need a real
process (a child to kill, a command to run) belong in ``tests/integration`` or ``tests/fault``.

The hooks below are path-scoped (pytest calls a subfolder conftest's runtest hooks for the items
under it only), so integration and fault tests in the same pytest process are untouched."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess

import _posixsubprocess
import pytest


# Importing MLflow asks for platform.platform(), and CPython answers its processor field by running
# `uname -p` (once per process, then cached on the uname result). Seeded here with what Linux's
# uname -p says ("unknown", which platform reports as ""), so importing MLflow starts no process.
platform.uname().__dict__.setdefault("processor", "")


class SubprocessInUnitTest(RuntimeError):
    """A unit test started (or tried to start) a process."""


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise SubprocessInUnitTest(
            f"{what} in a unit test: tests/unit starts no process (move the test to tests/integration, "
            f"or test the logic in-process); see docs/testing.md")
    return refuse


# (owner, attribute, name in the message). subprocess.Popen (and so subprocess.run, os.popen,
# asyncio's subprocesses) and multiprocessing's spawn/forkserver go through fork_exec or
# posix_spawn; multiprocessing's fork, pty.fork and os.spawn* through fork/forkpty.
_STARTS = [
    (subprocess.Popen, "_execute_child", "subprocess.Popen"),
    (subprocess, "_fork_exec", "subprocess fork_exec"),
    (_posixsubprocess, "fork_exec", "_posixsubprocess.fork_exec"),
    (os, "fork", "os.fork"),
    (os, "forkpty", "os.forkpty"),
    (os, "posix_spawn", "os.posix_spawn"),
    (os, "posix_spawnp", "os.posix_spawnp"),
    (os, "system", "os.system"),
]


@contextlib.contextmanager
def no_process_starts():
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in _STARTS if hasattr(owner, name)]
    try:
        for owner, name, what in _STARTS:
            if hasattr(owner, name):
                setattr(owner, name, _refuse(what))
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with no_process_starts():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with no_process_starts():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with no_process_starts():
        return (yield)
