"""A torchrun job started *held*: its workers start up, then wait for one word before training.

Saves the job's start-up (torchrun, torch's import, the data: ~6 s on 2 cores) from the
critical path: the caller does its own work meanwhile (``flows/prelaunch.py``).

- Launcher side: ``start_held(spec)`` starts the job (``training.launcher.start_job``) and
  returns a ``HeldJob``; ``go()`` lets it train and returns the ``Job`` to ``finish()``;
  ``abort(reason)`` makes its workers exit untrained.
- Worker side: ``wait_for_go(out)``, after start-up and before the process group, returns
  ``(True, "")`` to train or ``(False, why)`` to exit without training or writing.

The word is ``<out>/go.json``, written atomically: ``{"go": true}`` or ``{"go": false,
"reason": ...}``. Every rank reads it itself (a held job is single-node, its folder local), so
no collective is needed. The workers also give up when the launching process has exited or
after ``GO_TIMEOUT_S``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from core.errors import PreemptedError
from core.procs import pid_alive
from training import preemption
from training.agent import LAUNCHER_PID_ENV
from training.launcher import Job, JobSpec, start_job

GO_FILE = "go.json"
# Set to the launching pid in a held job's environment. A worker waits only when it equals the
# launcher pid ``start_job`` set for this very job: a value inherited from elsewhere never holds one.
HELD_ENV = "TRAINFLOW_HELD"
GO_TIMEOUT_S = 900.0


class HeldJob:
    """A started job whose workers wait for ``go()`` or ``abort()``."""

    def __init__(self, job: Job):
        self.job = job
        self.go_file = Path(job.spec.out_dir) / GO_FILE

    @property
    def waiting(self) -> bool:
        """No word sent yet."""
        return not self.go_file.exists()

    def _send(self, payload: dict) -> None:
        tmp = self.go_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload))
        tmp.replace(self.go_file)  # atomic: a worker never reads half a decision

    def go(self) -> Job:
        """Let the job train; returns it (``finish()`` waits for it, its ``wall_s`` counts from now).

        A SIGTERM that came while it was held aborts it instead and raises PreemptedError, as
        ``start_job`` refuses to start a job then.
        """
        if preemption.REQUESTED.is_set():
            self.abort("preempted before training started")
            preemption.REQUESTED.clear()
            raise PreemptedError("preempted before training started; nothing to resume yet")
        try:
            self._send({"go": True})
        except BaseException:  # the workers never heard it: they must not wait for it
            self.job.kill()
            raise
        self.job.started_at = time.perf_counter()
        return self.job

    def abort(self, reason: str, grace_s: float = 10.0) -> None:
        """Stop the job: a waiting one exits before its first step; one that went on is killed.

        A held job that has not exited within ``grace_s`` (its workers were still starting up) is
        SIGKILLed, not SIGTERMed: it never trained, so nothing is lost, and torchrun answers a
        SIGTERM with a traceback on the user's terminal after the flow's own error."""
        if self.waiting:
            self._send({"go": False, "reason": reason})
            try:
                self.job.proc.wait(timeout=grace_s)
                return
            except subprocess.TimeoutExpired:
                pass
            self.job.kill(now=True)
            return
        self.job.kill()


def start_held(spec: JobSpec, lock_fd: int | None = None) -> HeldJob:
    """``start_job(spec, lock_fd=lock_fd)`` with its workers held (see the module doc)."""
    (Path(spec.out_dir) / GO_FILE).unlink(missing_ok=True)
    return HeldJob(start_job(spec, lock_fd=lock_fd, launch_env={HELD_ENV: str(os.getpid())}))


def wait_for_go(out: Path, poll_s: float = 0.02) -> tuple[bool, str]:
    """Worker side: ``(True, "")`` to train, ``(False, why)`` to exit untrained.

    Returns at once when this job was not started held.
    """
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if not launcher or os.environ.get(HELD_ENV) != launcher:
        return True, ""
    go_file, parent = Path(out) / GO_FILE, int(launcher)
    deadline = time.monotonic() + GO_TIMEOUT_S
    while True:
        try:
            payload = json.loads(go_file.read_text())
        except (FileNotFoundError, ValueError):  # a torn read cannot happen (atomic rename): never train on one
            payload = None
        if payload is not None:
            if payload.get("go"):
                return True, ""
            return False, str(payload.get("reason") or "aborted by the launcher")
        if not pid_alive(parent):
            return False, f"the launching process {parent} exited before training started"
        if time.monotonic() > deadline:
            return False, f"no go signal within {GO_TIMEOUT_S:g} s"
        time.sleep(poll_s)
