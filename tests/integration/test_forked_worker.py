"""torchrun's forked worker entry (training.agent._forked_worker) in a fresh interpreter that, like
torchrun's agent, handles SIGTERM and SIGINT itself."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_a_forked_worker_starts_with_the_default_signal_handlers_and_its_own_argv(repo_root, tmp_path):
    # In a fresh interpreter that, like torchrun's agent, handles SIGTERM and SIGINT itself.
    code = """
import json, signal, sys, types
from training import agent
signal.signal(signal.SIGTERM, lambda *_: None)
signal.signal(signal.SIGINT, lambda *_: None)
def main(argv):
    seen = {"argv": argv, "sys_argv": sys.argv, "term_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
            "int_default": signal.getsignal(signal.SIGINT) is signal.default_int_handler}
    print(json.dumps(seen))
    return 3
sys.modules["fake_worker"] = types.SimpleNamespace(main=main)
agent._forked_worker("fake_worker", "--out", "x")
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr  # main's status is the process's exit status
    assert json.loads(proc.stdout) == {"argv": ["--out", "x"], "sys_argv": ["fake_worker", "--out", "x"],
                                       "term_default": True, "int_default": True}
