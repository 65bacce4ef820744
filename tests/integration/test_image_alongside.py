"""scripts/image.py alongside (`make test`'s wrapper) with real processes: the builder beside the
command, niced in its own group, stopped with everything it started when the command ends.
(The image test itself: tests/integration/test_image.py.)"""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from core.procs import pid_alive
from tests.conftest import load_script
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def image():
    return load_script("image")


def test_alongside_runs_the_builder_niced_and_stops_all_it_started_when_the_command_ends(image, tmp_path):
    """`make test`'s wrapper: the command's exit status is its own, it sees where the builder's outcome
    will be, and the builder (niced, in a group of its own) and its child are gone once it ends."""
    builder = textwrap.dedent(f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(tmp_path / "pids")!r}, "w").write(f"{{os.getpid()}} {{child.pid}} {{os.nice(0)}} {{os.getpgid(0)}}")
        time.sleep(60)
    """)
    command = [sys.executable, "-c", textwrap.dedent(f"""
        import os, pathlib, sys, time
        pids = pathlib.Path({str(tmp_path / "pids")!r})
        while not pids.exists() or not pids.read_text():
            time.sleep(0.05)
        pathlib.Path({str(tmp_path / "env")!r}).write_text(os.environ["TRAINFLOW_IMAGE_STATUS"] + " "
                                                           + os.environ["TRAINFLOW_IMAGE_BUILDER"])
        sys.exit(3)
    """)]
    status = tmp_path / "image-test" / "status.json"
    status.parent.mkdir()
    status.write_text("{}")  # a stale outcome from an earlier run goes first
    rc = image.alongside(command, status, builder_cmd=[sys.executable, "-c", builder])
    assert rc == 3
    pid, child, nice, pgid = map(int, (tmp_path / "pids").read_text().split())
    assert nice == 19 and pgid == pid != os.getpgid(0)
    assert (tmp_path / "env").read_text() == f"{status} {pid}"
    assert not status.exists()
    assert not pid_alive(pid)
    wait_for(lambda: not pid_alive(child), 30, "the builder's child to be stopped with it")
