"""The torchrun agent of a launched job: ``torch.distributed.run``, bound to the process that launched it.

    python -m training.agent <torchrun arguments>      (what ``training.launcher`` runs)

torchrun runs in a session of its own (the launcher kills it as a group) and starts each
worker in a session of its own (an exec'd one; a forked one, ``_fork_workers``, stays in the
agent's), so none of them would notice the launcher, or the agent, dying: they would train
on as orphans in a folder the next run takes. So, before torchrun starts:

- the agent asks for SIGTERM when its launcher dies (``PR_SET_PDEATHSIG``); torchrun's own
  SIGTERM handling passes it to the workers, which checkpoint as on a preemption, and kills
  those still running after ``--shutdown-timeout`` (``training.preempt_grace_s``);
- it exports its pid, and each worker asks for SIGKILL when the agent dies (``bind_worker``,
  first thing in ``training.worker``): with the agent gone nothing would stop them.

When a worker fails (or the job restarts), torch stops the other workers with a fixed 30 s
grace before SIGKILL, whatever ``--shutdown-timeout`` says; a peer hung in a collective kept a
failed job, or a restart, waiting that long. The agent bounds those stops by
``--shutdown-timeout`` too (``_stop_within_shutdown_timeout``).

Both check that their parent is still the process they expect after the request, so a parent
that died a moment before is not missed. The kernel sends the parent-death signal again each
time the orphan is handed to another thread of its dying parent, so a killed launcher with many
threads can SIGTERM the agent several times (seen: three, on a loaded machine). torchrun raises
at every one, and one raised while it stops its workers broke off that stop before its SIGKILL:
the agent then waited at exit for workers that had ignored SIGTERM, and both lived on. So the
agent takes the first termination signal only (``_stop_once``), and SIGKILLs any worker still
there when torchrun returns (``_kill_workers_left``). The training folder's lock (``training.slots``) is
inherited by this process and lives until it exits, after its workers.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

LAUNCHER_PID_ENV = "TRAINFLOW_LAUNCHER_PID"
AGENT_PID_ENV = "TRAINFLOW_AGENT_PID"
# "fork": the agent imports the worker module (torch, dynamo) once and forks each worker from
# itself (``_fork_workers``); anything else: torchrun execs ``python -u -m MODULE`` per worker.
WORKER_START_ENV = "TRAINFLOW_WORKER_START"


def bind_worker() -> None:
    """Worker side: SIGKILL this worker when its torchrun agent exits; exit now if it has already.

    Does nothing outside torchrun (a plain ``python -m training.worker`` keeps its usual life).
    """
    agent = os.environ.get(AGENT_PID_ENV)
    if not agent and "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    from core.procs import die_with_parent

    if not die_with_parent(signal.SIGKILL, int(agent) if agent else None):
        print(f"training.worker: its torchrun agent {agent} exited before it started; exiting", file=sys.stderr)
        os._exit(1)


def _stop_within_shutdown_timeout(argv: list[str]) -> None:
    """Bound every stop of the workers by ``--shutdown-timeout``: torch's process context stops
    the surviving workers after a failure with a fixed 30 s grace (``close()`` with its default,
    and for forked workers ``ProcessContext.join``), and so does the agent before a restart,
    whatever ``--shutdown-timeout`` says."""
    grace = next((float(a.split("=", 1)[1]) for a in argv if a.startswith("--shutdown-timeout=")), None)
    if grace is None:
        return
    from torch.distributed.elastic.multiprocessing import api

    close = getattr(api.PContext, "close", None)
    if close is None or getattr(close, "_trainflow_bounded", False):
        return  # another torch, or done already

    def bounded_close(self, death_sig=None, timeout: float = 30):
        return close(self, death_sig, min(timeout, grace))

    bounded_close._trainflow_bounded = True
    api.PContext.close = bounded_close

    # Forked workers (``_fork_workers``): when one fails, torch's process context waits 30 s
    # before it SIGKILLs the others (after a SIGTERM our workers take as a preemption).
    spawn = importlib.import_module("torch.multiprocessing.spawn")  # the module, not the function of that name
    join = spawn.ProcessContext.join
    if getattr(join, "_trainflow_bounded", False):
        return

    def bounded_join(self, timeout=None, grace_period=None):
        return join(self, timeout, grace if grace_period is None else min(grace_period, grace))

    bounded_join._trainflow_bounded = True
    spawn.ProcessContext.join = bounded_join


def _stop_once() -> None:
    """Take only the first termination signal: torchrun raises ``SignalException`` at each, and the
    first already shuts the agent down (its ``run`` stops the workers and re-raises; no restart
    follows). A later one raised inside that stop would break it off before its SIGKILL."""
    from torch.distributed.elastic.multiprocessing import api

    handler = getattr(api, "_terminate_process_handler", None)
    if handler is None or getattr(handler, "_trainflow_once", False):
        return  # another torch, or done already

    def terminate_once(signum, frame):
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN)  # the stop under way is bounded by --shutdown-timeout
        handler(signum, frame)

    terminate_once._trainflow_once = True
    api._terminate_process_handler = terminate_once  # looked up when torchrun installs its handlers


def _kill_workers_left() -> None:
    """SIGKILL the forked workers still alive once torchrun is done (none, unless its stop was
    broken off): Python's exit would otherwise wait for them, and they for nothing."""
    import multiprocessing

    for child in multiprocessing.active_children():
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.join(5)


def _fresh_store_per_round(argv: list[str]) -> None:
    """Over c10d (several agents), give each rendezvous round a fresh bootstrap store.

    torch 2.13 shares the rank-0 agent's TCPStore with the workers and publishes its address only
    in the first round an agent takes part in: an agent that joins a later round (an elastic
    node coming in, or a replacement) waits for an address the old rank 0 never writes again,
    and both agents time out after 60 s (seen here with --nnodes 1:2). Without sharing, rank 0
    publishes a fresh address every round and its worker hosts the store (env://).
    """
    if "--rdzv-backend=c10d" in argv:
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")


def _forked_worker(module: str, *argv: str) -> int:
    """A worker forked from the agent (torchrun's function entrypoint): what ``python -u -m
    MODULE ARGV`` would have run (``MODULE.main(ARGV)``, its exit status the return value), in a
    process that already holds its imports.

    The fork inherits the agent's Python state, so first undo what the agent set for itself:
    torchrun's signal handlers (SIGTERM would raise torchrun's SignalException here, before the
    worker's preemption handler is in place), the agent's logging handlers (the worker's
    ``basicConfig`` would do nothing) and block-buffered output (``-u``).
    """
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import logging

    for handler in list(logging.root.handlers):
        logging.root.removeHandler(handler)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):  # a TextIOWrapper, as torchrun leaves them
            stream.reconfigure(write_through=True)
    sys.argv = [module, *argv]
    status = importlib.import_module(module).main(list(argv))
    if status:
        sys.exit(status)  # the process's exit status, as ``sys.exit(main())`` gives it
    return 0


def _fork_workers() -> None:
    """Start the workers by fork (torchrun's ``start_method="fork"``) instead of a fresh ``python``
    each: a worker then starts in ~0.2 s of CPU, not the ~4 s of importing torch and dynamo (which
    the first optimizer step imports) again in every worker of every launch and restart.

    Only for ``-m MODULE`` jobs (a module with ``main(argv)``, as ``training.worker``) the launcher
    marks: CPU jobs, as a process that initialised CUDA cannot be forked, so GPU jobs keep
    torchrun's exec. The agent imports the module, and dynamo, when torchrun has parsed its
    arguments: no CUDA, no thread pool and no process group exists in it yet.
    """
    import torch.distributed.run as run

    original = run.config_from_args

    def config_from_args(args):
        config, cmd, cmd_args = original(args)
        if not (args.module and not args.no_python):
            return config, cmd, cmd_args
        import torch._dynamo  # noqa: F401  (what every worker's first optimizer step imports)

        importlib.import_module(args.training_script)
        config.start_method = "fork"
        return config, _forked_worker, [args.training_script, *args.training_script_args]

    run.config_from_args = config_from_args


def main() -> None:
    from core.procs import die_with_parent

    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if not die_with_parent(signal.SIGTERM, int(launcher) if launcher else None):
        print(f"training.agent: the launching process {launcher} exited before torchrun started", file=sys.stderr)
        sys.exit(1)
    os.environ[AGENT_PID_ENV] = str(os.getpid())
    from torch.distributed.run import main as torchrun

    _stop_within_shutdown_timeout(sys.argv[1:])
    _stop_once()
    _fresh_store_per_round(sys.argv[1:])
    if os.environ.get(WORKER_START_ENV) == "fork":
        _fork_workers()
    try:
        torchrun()  # reads sys.argv[1:]
    finally:
        _kill_workers_left()


if __name__ == "__main__":
    main()
