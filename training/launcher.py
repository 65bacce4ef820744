"""Launch a training plan (``training.plan``) on this host: torchrun as a subprocess (killable as
one process group, torch's state kept out of the caller), and collect its result, or a
``TrainingFailedError`` naming the first failing rank with its traceback. The job dies with this
process (``training.agent``)."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from core.errors import ConfigError, PreemptedError, TrainingFailedError
from core.paths import python_path_with
from core.procs import children, pid_alive
from training import preemption
from training.agent import LAUNCHER_PID_ENV, WORKER_START_ENV
from training.layouts import mismatch_error
from training.plan import LaunchPlan, parse_nnodes
from training.slots import completed

log = logging.getLogger("trainflow.launcher")

# The job's --nnodes for its workers: torchrun tells them the nodes present, not whether it is elastic.
NNODES_ENV = "TRAINFLOW_NNODES"
# "1": rank 0 also scores the exported program on the test split into tasks.base.SCORES_FILE; the pipeline sets it.
SCORE_ENV = "TRAINFLOW_SCORE_TEST"
# A worker's input error (a TrainflowError): the launcher stops the job rather than let torchrun restart it.
FATAL_FILE = "fatal.json"
REAP_GRACE_S = 60.0


@dataclass(frozen=True)
class Hooks:
    """What the caller learns while a cluster job runs: a line to log (state changes, each node's
    log), and the job id when it is submitted and when it has ended (the run keeps a record of its
    live jobs, so that a run killed with SIGKILL leaves none behind: registry.orphans)."""

    log: Callable[[str], None] = print
    submitted: Callable[[str], None] = lambda job_id: None
    ended: Callable[[str], None] = lambda job_id: None



@dataclass(frozen=True)
class JobSpec:
    """Everything needed to run (and rerun) one training job; written to ``<out>/job.json``. Every
    node runs the same spec with its own ``node_rank``; ``rdzv_id`` must not be guessable (the
    agents unpickle what the c10d store holds under it)."""

    config_path: str
    out_dir: str
    root: str
    data_md5: str
    nproc_per_node: int
    nnodes: int | str = 1  # N, or "MIN:MAX" (elastic)
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None  # make_spec draws one when a single node meets at an endpoint
    max_restarts: int = 0
    rdzv_conf: str = ""  # torchrun's --rdzv-conf for c10d (training.rendezvous)
    timeout_s: float = 900.0
    preempt_grace_s: float = 30.0
    threads_per_worker: int = 1
    force_resume: bool = False
    env: dict[str, str] = field(default_factory=dict)
    fork_workers: bool = False  # the agent forks the workers (CPU only: a CUDA process cannot fork)

    @property
    def node_range(self) -> tuple[int, int]:
        """(MIN, MAX) agents of this job; equal unless it is elastic."""
        return parse_nnodes(self.nnodes)

    def command(self, log_dir: Path) -> list[str]:
        # training.agent: torchrun bound to this process, giving workers preempt_grace_s on SIGTERM.
        cmd = [sys.executable, "-m", "training.agent",
               f"--nnodes={self.nnodes}", f"--nproc-per-node={self.nproc_per_node}",
               f"--max-restarts={self.max_restarts}", f"--log-dir={log_dir}",
               f"--shutdown-timeout={max(1, math.ceil(self.preempt_grace_s))}"]
        if self.node_range[1] == 1 and not self.rdzv_endpoint:
            cmd.append("--standalone")  # local c10d rendezvous on a free port
        else:
            cmd += [f"--node-rank={self.node_rank}", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={self.rdzv_endpoint}", f"--rdzv-id={self.rdzv_id}"]
            if self.rdzv_conf:
                cmd.append(f"--rdzv-conf={self.rdzv_conf}")
        cmd += ["-m", "training.worker", "--config", self.config_path, "--out", self.out_dir,
                "--root", self.root, "--data-md5", self.data_md5]
        return cmd + (["--force-resume"] if self.force_resume else [])


def make_spec(plan: LaunchPlan, out_dir: Path, *args, **kwargs) -> JobSpec:
    """The torchrun job that runs ``plan`` on this host (``plan_spec``'s arguments), with its config
    written into ``out_dir`` (what the workers read). ConfigError when several nodes lack a rendezvous."""
    spec = plan_spec(plan, out_dir, *args, **kwargs)
    out_dir.mkdir(parents=True, exist_ok=True)
    Path(spec.config_path).write_text(plan.cfg.to_yaml())
    return spec


def plan_spec(plan: LaunchPlan, out_dir: Path, root: Path, data_md5: str, env: dict[str, str] | None = None,
              node_rank: int = 0, rdzv_endpoint: str | None = None, rdzv_id: str | None = None,
              force_resume: bool = False) -> JobSpec:
    """``make_spec``'s job without writing anything: its config is to be written to ``config_path``
    (a cluster launcher renders it for nodes that are not this host)."""
    hi = plan.node_range[1]
    if hi > 1 and not rdzv_endpoint:
        raise ConfigError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
    if hi > 1 and not rdzv_id:
        raise ConfigError("--nnodes > 1 needs --rdzv-id: a random id every node of the job shares, e.g. from "
                          "`python -c 'import secrets; print(secrets.token_hex(16))'` (trainflow k8s-job draws one)")
    if rdzv_endpoint and not rdzv_id:
        rdzv_id = secrets.token_hex(16)
    config_path = out_dir / "config.yaml"
    t = plan.cfg.training
    r = t.rendezvous
    return JobSpec(
        config_path=str(config_path), out_dir=str(out_dir), root=str(root), data_md5=data_md5,
        nproc_per_node=plan.nproc_per_node, nnodes=plan.nnodes, node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, max_restarts=t.max_restarts,
        rdzv_conf=(f"join_timeout={r.join_timeout_s},last_call_timeout={r.last_call_s},"
                   f"keep_alive_interval={r.keep_alive_s},keep_alive_max_attempt=3"),
        timeout_s=t.timeout_s, preempt_grace_s=t.preempt_grace_s, threads_per_worker=t.threads_per_worker,
        force_resume=force_resume, env=dict(env or {}), fork_workers=plan.backend == "gloo",
    )


def launch(plan: LaunchPlan, out_dir: Path, root: Path, data_md5: str, env: dict[str, str] | None = None,
           force_resume: bool = False, lock_fd: int | None = None, **rendezvous) -> Job:
    """Start ``plan`` in ``out_dir`` (``start_job``), after refusing checkpoints there that it may not
    resume (``_check_resumable``); ``rendezvous``: ``make_spec``'s node_rank, rdzv_endpoint, rdzv_id."""
    check_plan_resumable(plan, out_dir, data_md5, force_resume)
    return start_job(make_spec(plan, out_dir, root, data_md5, env, force_resume=force_resume, **rendezvous), lock_fd)


def check_plan_resumable(plan: LaunchPlan, out_dir: Path, data_md5: str, force: bool = False) -> None:
    """``_check_resumable`` for ``plan``'s config and layout (every launcher, before it starts)."""
    _check_resumable(Path(out_dir), plan.cfg.config_id(), data_md5, force, plan.layout, plan.cfg.resume_id())


def _check_resumable(out_dir: Path, config_id: str, data_md5: str, force: bool, layout: dict | None = None,
                     resume_id: str | None = None) -> None:
    """Refuse before launching (not after every restart) when ``out_dir`` holds checkpoints of
    another config, dataset or model-parallel layout."""
    from training.checkpoint import CheckpointMismatchError, check_identity, latest_identity
    found = latest_identity(out_dir / "checkpoints")
    if not found:
        return
    theirs = found.get("layout")
    # Sharded or staged checkpoints load only into the layout that wrote them: --force-resume cannot help.
    if layout and theirs and (error := mismatch_error(out_dir / "checkpoints", theirs, layout)):
        raise ConfigError(str(error))
    if force:
        return
    try:
        check_identity(found, config_id, data_md5, resume_id, where=str(out_dir))
    except CheckpointMismatchError as exc:
        raise ConfigError(str(exc)) from None


def _first_failure(log_dir: Path) -> tuple[int | None, str, str]:
    """(local rank, message, traceback) of the earliest error file of torchrun's last attempt."""
    found = []
    for path in log_dir.glob("*/attempt_*/*/error.json"):
        try:
            msg = json.loads(path.read_text())["message"]
            if isinstance(msg, str):  # some versions store the payload as a JSON string
                msg = json.loads(msg)
            info = msg.get("extraInfo", {})
            attempt = int(path.parent.parent.name.split("_")[1])
            # The stamp has whole seconds; the mtime orders errors within one (the crashing rank writes first).
            found.append((attempt, int(info.get("timestamp", 0)), path.stat().st_mtime_ns, int(path.parent.name),
                          msg.get("message", ""), info.get("py_callstack", "")))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
            continue
    if not found:
        return None, "", ""
    last_attempt = max(f[0] for f in found)
    return min(f for f in found if f[0] == last_attempt)[3:]


def _kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the job's process group, then SIGKILL it after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=grace_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def write_fatal(out: Path, rank: int, exc: BaseException) -> None:
    """Record ``exc`` (a TrainflowError on ``rank``) for the launcher; first writer wins."""
    path = Path(out) / FATAL_FILE
    if path.exists():
        return
    tmp = path.with_name(f"{FATAL_FILE}.{rank}.tmp")
    tmp.write_text(json.dumps({"rank": rank, "error": f"{type(exc).__name__}: {exc}",
                               "traceback": "".join(traceback.format_exception(exc))}))
    tmp.replace(path)


def await_stop_after_fatal(limit_s: float = 10.0) -> None:
    """After :func:`write_fatal`, wait (at most ``limit_s``) for the launcher's SIGTERM: exiting at
    once would let torchrun restart into the same error. Returns at once without a launcher."""
    launcher = int(os.environ.get(LAUNCHER_PID_ENV) or 0)
    if not launcher:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the preemption handler would checkpoint first
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and pid_alive(launcher):
        time.sleep(0.05)


def _wait(proc: subprocess.Popen, spec: JobSpec, at_result: bool = False) -> tuple[int | None, bool]:
    """(exit code, preempted): wait for torchrun within the time limits, forwarding a preemption.
    ``at_result``: ``(None, False)`` once rank 0's completed result is written."""
    out = Path(spec.out_dir)
    deadline = time.monotonic() + spec.timeout_s
    preempted_at, signalled = None, set()
    while True:
        try:
            return proc.wait(timeout=0.2), preempted_at is not None
        except subprocess.TimeoutExpired:
            pass
        if at_result and preempted_at is None and completed(out):
            return None, False
        fatal = None
        with contextlib.suppress(OSError, ValueError):
            fatal = json.loads((out / FATAL_FILE).read_text())
        if fatal is not None:  # deterministic: a restart would fail the same way
            _kill_group(proc, grace_s=5.0)
            raise TrainingFailedError(f"training failed on rank {fatal['rank']}: {fatal['error']} "
                                      "(an input error: not retried)", rank=fatal["rank"],
                                      traceback=fatal.get("traceback", ""))
        now = time.monotonic()
        if preemption.REQUESTED.is_set():
            preempted_at = preempted_at or now
            # The workers checkpoint and exit; signalling the agent would make it kill them at once.
            for pid in set(children(proc.pid)) - signalled:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                    signalled.add(pid)
        if preempted_at is not None and signalled and not children(proc.pid):
            # Done here; the agent may wait in the exit barrier for agents that carry on (elastic).
            _kill_group(proc, grace_s=5.0)
            return proc.returncode, True
        if preempted_at is not None and now - preempted_at > spec.preempt_grace_s:
            _kill_group(proc)
            preemption.REQUESTED.clear()
            raise PreemptedError(
                f"preempted: workers did not checkpoint within training.preempt_grace_s="
                f"{spec.preempt_grace_s:g}s and were killed; the next run resumes from the last checkpoint")
        if now > deadline:
            _kill_group(proc)
            raise TrainingFailedError(f"training exceeded training.timeout_s={spec.timeout_s:g}s and was killed")


@dataclass
class Job:
    """A started torchrun job: ``finish()`` waits for it and returns ``result.json``."""

    spec: JobSpec
    proc: subprocess.Popen
    started_at: float = field(default_factory=time.perf_counter)  # wall_s counts from here

    def finish(self, at_result: bool = False) -> dict:
        """Wait for the job; return ``result.json`` plus ``wall_s`` and ``out_dir``. ``at_result``:
        return once rank 0's completed result is written; the exiting processes are reaped later.
        Raises TrainingFailedError (naming the failing rank) or PreemptedError (a checkpoint saved)."""
        spec, out = self.spec, Path(self.spec.out_dir)
        with preemption.handling():
            try:
                rc, preempted = _wait(self.proc, spec, at_result)
            except BaseException:  # timeout, Ctrl-C, task cancellation: leave no worker behind
                _kill_group(self.proc)
                raise
        wall = time.perf_counter() - self.started_at
        if rc is None:  # completed; the processes are still exiting
            _reap_later(self.proc)
            rc = 0
        log_dir, result_path = out / "torchrun", out / "result.json"
        result = json.loads(result_path.read_text()) if result_path.is_file() else None
        if rc != 0 and not (preempted and result and result.get("status") == "preempted"):
            rank, message, tb = _first_failure(log_dir)
            # Error files name local ranks; c10d numbers nodes by arrival, so only on one node is it global.
            where = "a worker" if rank is None else f"rank {rank}" if spec.node_range[1] == 1 \
                else f"local rank {rank} of this node"
            detail = f": {message}" if message else f" (torchrun exit code {rc}; see {log_dir})"
            raise TrainingFailedError(f"training failed on {where}{detail}", rank=rank, traceback=tb)
        if result is None:  # every node writes one (rank 0's, or a node copy: training.multinode)
            raise TrainingFailedError(f"torchrun exited {rc} but wrote no {result_path}")
        if result.get("status") == "preempted":
            preemption.REQUESTED.clear()  # handled: this request ends here
            raise PreemptedError(f"preempted at step {result['steps']}: checkpoint saved in {out / 'checkpoints'}; "
                                 "rerun with the same output folder to resume")
        return {**result, "wall_s": wall, "out_dir": str(out)}


_EXITING: list[threading.Thread] = []


def _reap_later(proc: subprocess.Popen) -> None:
    """Wait for a job that already wrote its completed result, in a thread; kill it if it hangs."""
    def reap() -> None:
        try:
            if rc := proc.wait(timeout=REAP_GRACE_S):
                log.warning("torchrun (pid %s) exited %s after writing a completed result", proc.pid, rc)
        except subprocess.TimeoutExpired:
            log.warning("torchrun (pid %s) still running %.0f s after its completed result; killed",
                        proc.pid, REAP_GRACE_S)
            _kill_group(proc)

    thread = threading.Thread(target=reap, name=f"reap-torchrun-{proc.pid}", daemon=True)
    thread.start()
    if not _EXITING:
        atexit.register(reap_exiting)
    _EXITING.append(thread)


def reap_exiting() -> None:
    """Block until every job returned early by ``finish(at_result=True)`` has exited (bounded)."""
    while _EXITING:
        _EXITING.pop().join(REAP_GRACE_S + 15)


def job_env(spec: JobSpec) -> dict[str, str]:
    """The variables every node's torchrun agent needs for ``spec`` (beyond PYTHONPATH with the root)."""
    return {**spec.env, "OMP_NUM_THREADS": str(spec.threads_per_worker), NNODES_ENV: str(spec.nnodes),
            WORKER_START_ENV: "fork" if spec.fork_workers else "exec"}


def start_job(spec: JobSpec, lock_fd: int | None = None) -> Job:
    """Start torchrun for ``spec`` and return at once; the job dies with the *thread* that calls this.
    ``lock_fd``: the training folder's ``flock``, inherited so it stays locked until the job exits."""
    if preemption.REQUESTED.is_set():  # SIGTERM arrived in an earlier stage: don't start at all
        preemption.REQUESTED.clear()
        raise PreemptedError("preempted before training started; nothing to resume yet")
    out = Path(spec.out_dir)
    (out / "job.json").write_text(json.dumps(asdict(spec), indent=2))
    # An earlier run's result must not pass for this one's, on any node (c10d may put rank 0 anywhere).
    (out / "result.json").unlink(missing_ok=True)
    (out / FATAL_FILE).unlink(missing_ok=True)
    # The repository root first on the path, so a model.factory module there imports in every worker.
    env = {**os.environ, **job_env(spec)}
    env.update(PYTHONPATH=python_path_with(spec.root, env.get("PYTHONPATH")), **{LAUNCHER_PID_ENV: str(os.getpid())})
    proc = subprocess.Popen(spec.command(out / "torchrun"), cwd=spec.root, env=env, start_new_session=True,
                            pass_fds=() if lock_fd is None else (lock_fd,))
    return Job(spec, proc)


def run_job(spec: JobSpec) -> dict:
    """Run torchrun for ``spec``; return ``result.json`` (plus ``wall_s``); raises as ``Job.finish``."""
    return start_job(spec).finish()
