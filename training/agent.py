"""``python -m training.agent <torchrun arguments>``: torchrun, bound to the launcher that runs it.

torchrun and its workers run in sessions of their own and would train on as orphans when the
launcher dies. So the agent asks for SIGTERM when its launcher dies (``PR_SET_PDEATHSIG``; the
workers then checkpoint as on a preemption), and each worker for SIGKILL when the agent dies
(``bind_worker``); both then check their parent is still the expected one, in case it died first.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
import signal
import sys

from core.procs import die_with_parent

LAUNCHER_PID_ENV = "TRAINFLOW_LAUNCHER_PID"
AGENT_PID_ENV = "TRAINFLOW_AGENT_PID"
# "fork": the agent forks each worker from itself (``_fork_workers``); else torchrun execs each.
WORKER_START_ENV = "TRAINFLOW_WORKER_START"


def bind_worker() -> None:
    """Worker side: SIGKILL this worker when its torchrun agent exits; exit now if it has already.
    Does nothing outside torchrun."""
    agent = os.environ.get(AGENT_PID_ENV)
    if not agent and "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    if not die_with_parent(signal.SIGKILL, int(agent) if agent else None):
        print(f"training.worker: its torchrun agent {agent} exited before it started; exiting", file=sys.stderr)
        os._exit(1)


def _bound(owner, name: str, wrap) -> None:
    """Replace ``owner.name`` with ``wrap(original)`` once (a torch without it: nothing)."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_trainflow", False):
        return
    wrapped = wrap(original)
    wrapped._trainflow = True
    setattr(owner, name, wrapped)


def _stop_within_shutdown_timeout(argv: list[str]) -> None:
    """Bound torch's fixed 30 s grace when it stops the workers (``PContext.close``, and
    ``ProcessContext.join`` for forked ones) by ``--shutdown-timeout``."""
    grace = next((float(a.split("=", 1)[1]) for a in argv if a.startswith("--shutdown-timeout=")), None)
    if grace is None:
        return
    from torch.distributed.elastic.multiprocessing import api

    _bound(api.PContext, "close", lambda close: lambda self, death_sig=None, timeout=30:
           close(self, death_sig, min(timeout, grace)))
    spawn = importlib.import_module("torch.multiprocessing.spawn")  # the module, not the function of that name
    _bound(spawn.ProcessContext, "join", lambda join: lambda self, timeout=None, grace_period=None:
           join(self, timeout, grace if grace_period is None else min(grace_period, grace)))


def _stop_once() -> None:
    """Take only the first termination signal (the kernel may send the parent-death signal once per
    thread of a dying launcher): a later one, raised inside torchrun's stop, broke it off before
    its SIGKILL, leaving the agent waiting at exit for workers that ignored SIGTERM."""
    from torch.distributed.elastic.multiprocessing import api

    def wrap(handler):
        def terminate_once(signum, frame):
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
                signal.signal(sig, signal.SIG_IGN)  # the stop under way is bounded by --shutdown-timeout
            handler(signum, frame)
        return terminate_once

    _bound(api, "_terminate_process_handler", wrap)  # looked up when torchrun installs its handlers


def _kill_workers_left() -> None:
    """SIGKILL the forked workers still alive once torchrun is done: Python's exit would otherwise
    wait for them, and they for nothing."""
    for child in multiprocessing.active_children():
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
        child.join(5)


def _fresh_store_per_round(argv: list[str]) -> None:
    """Over c10d, give each rendezvous round a fresh bootstrap store: with the rank-0 agent's
    TCPStore shared, its address is published only in an agent's first round, and an agent that
    joins a later round (an elastic node, a replacement) waits for it until both time out."""
    if "--rdzv-backend=c10d" in argv:
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")


def _forked_worker(module: str, *argv: str) -> int:
    """A forked worker (torchrun's function entrypoint): ``MODULE.main(ARGV)`` as ``python -u -m``
    runs it, after undoing torchrun's signal handlers, the agent's logging handlers and buffering."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.root.handlers.clear()
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(write_through=True)
    sys.argv = [module, *argv]
    status = importlib.import_module(module).main(list(argv))
    if status:
        sys.exit(status)  # the process's exit status, as ``sys.exit(main())`` gives it
    return 0


def _fork_workers() -> None:
    """Start ``-m MODULE`` workers by fork, so torch and dynamo are imported once per agent (after
    torchrun parsed its arguments, before any thread pool exists). CPU jobs only: a process that
    initialised CUDA cannot fork."""
    import torch.distributed.run as run

    original = run.config_from_args

    def config_from_args(args):
        config, cmd, cmd_args = original(args)
        if not args.module or args.no_python:
            return config, cmd, cmd_args
        import torch._dynamo  # noqa: F401  (what every worker's first optimizer step imports)

        importlib.import_module(args.training_script)
        config.start_method = "fork"
        return config, _forked_worker, [args.training_script, *args.training_script_args]

    run.config_from_args = config_from_args


def main() -> None:
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
