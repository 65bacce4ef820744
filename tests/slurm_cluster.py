"""A real two-node Slurm cluster on loopback, for tests: ``munged`` with its own key and socket,
``slurmctld``, and two ``slurmd`` (``-N n1``, ``-N n2``) on this host, with every file (config,
state, spool, logs, pid files) in one folder. Clients find it through ``SLURM_CONF``.

    with slurm_cluster(tmp) as cluster:
        subprocess.run(["sbatch", ...], env=cluster.env)

Debian's ``slurm-wlm`` and ``munge`` packages provide the daemons (``apt-get install -y slurm-wlm
munge`` as root). Everything is stopped by the pids in its pid files, never by name.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

NODES = ("n1", "n2")
DAEMONS = ("munged", "slurmctld", "slurmd", "sinfo", "sbatch", "squeue", "scontrol", "scancel")
ENABLE = "apt-get install -y slurm-wlm munge (as root) to run the Slurm tests"
START_LIMIT_S = 60.0
STOP_LIMIT_S = 20.0


def missing() -> list[str]:
    """The programs this cluster needs that are not installed (on PATH or in /usr/sbin)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [name for name in DAEMONS if not shutil.which(name, path=path)]


def poll(check: Callable[[], object], limit_s: float, what: str, every_s: float = 0.1) -> object:
    """``check()``'s first truthy value, asked every ``every_s`` until ``limit_s``; TimeoutError naming ``what``."""
    deadline = time.monotonic() + limit_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {limit_s:g} s")
        time.sleep(every_s)


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass(frozen=True)
class SlurmCluster:
    root: Path
    conf: Path

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` pointing at the cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command (``sinfo``, ``sbatch``, ...) against this cluster."""
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, check=check, timeout=30)

    def node_states(self) -> dict[str, str]:
        """{node: state} as ``sinfo`` reports it (``idle``, ``alloc``, ``down*``, ...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)


def _conf_text(root: Path, host: str, user: str, ctld_port: int, node_ports: list[int]) -> str:
    nodes = "\n".join(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=1 State=UNKNOWN"
                      for name, port in zip(NODES, node_ports, strict=True))
    return f"""\
ClusterName=trainflowtest
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket={root}/munge/munge.sock,cred_expire=5
# slurmrestd's clients (launcher.slurm.rest) carry a JWT that slurmctld checks with this key.
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key={root}/state/jwt.key
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
# Start a requeued job as soon as it may start again, not at the next periodic pass.
SchedulerParameters=bf_interval=1,sched_interval=2
MpiDefault=none
ReturnToService=2
KillWait=5
SlurmdTimeout=30
MinJobAge=300
# Refuse at submission what the partition can never run (many clusters do), rather than queue it.
EnforcePartLimits=ALL
{nodes}
PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def _pid_of(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _gone(pid: int) -> bool:
    """No such process, or a zombie (exited; a container's init may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _stop(pid_files: list[Path]) -> None:
    """SIGTERM the daemons whose pids ``pid_files`` hold, together; SIGKILL those alive after STOP_LIMIT_S."""
    pids = [pid for f in pid_files if (pid := _pid_of(f)) is not None]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    try:
        poll(lambda: all(_gone(pid) for pid in pids), STOP_LIMIT_S, f"pids {pids} to exit")
    except TimeoutError:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def slurm_cluster(root: Path) -> Iterator[SlurmCluster]:
    """Start the cluster in ``root`` (created), wait until ``sinfo`` reports both nodes idle, yield
    it, and stop every daemon it started (by pid file) on the way out. RuntimeError with the
    daemons' logs' tails when it does not come up."""
    if gaps := missing():
        raise RuntimeError(f"missing {', '.join(gaps)}: {ENABLE}")
    root = Path(root)
    for sub in ("munge", "state", "run", "log", *(f"spool/{n}" for n in NODES)):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "munge").chmod(0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    (root / "state" / "jwt.key").write_bytes(secrets.token_bytes(32))
    (root / "state" / "jwt.key").chmod(0o600)
    ctld_port, *node_ports = _free_ports(1 + len(NODES))
    conf = root / "slurm.conf"
    conf.write_text(_conf_text(root, socket.gethostname().split(".")[0], getpass.getuser(), ctld_port, node_ports))
    cluster = SlurmCluster(root, conf)
    sbin = os.pathsep.join(["/usr/sbin", "/sbin", os.environ.get("PATH", "")])
    pid_files = [root / "munge" / "munged.pid", root / "run" / "slurmctld.pid",
                 *(root / "run" / f"slurmd-{n}.pid" for n in NODES)]
    try:
        m = root / "munge"
        _daemon([shutil.which("munged", path=sbin), f"--socket={m}/munge.sock", f"--key-file={key}",
                 f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed",
                 "--force"], root, pid_files[0])
        _daemon([shutil.which("slurmctld", path=sbin), "-c", "-f", str(conf)], root, pid_files[1])
        for name, pid_file in zip(NODES, pid_files[2:], strict=True):
            _daemon([shutil.which("slurmd", path=sbin), "-N", name, "-f", str(conf)], root, pid_file)
        try:
            poll(lambda: all(cluster.node_states().get(n) == "idle" for n in NODES), START_LIMIT_S,
                 f"sinfo to report {', '.join(NODES)} idle")
        except TimeoutError as exc:
            raise RuntimeError(f"{exc}; sinfo says {cluster.node_states()}; logs:\n{_log_tails(root)}") from None
        yield cluster
    finally:
        _stop(pid_files[1:])  # the Slurm daemons, then munged, which they authenticate with
        _stop(pid_files[:1])


def restd_missing() -> bool:
    return not shutil.which("slurmrestd", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


@contextlib.contextmanager
def slurmrestd(cluster: SlurmCluster) -> Iterator[str]:
    """Slurm's REST API for ``cluster`` (OpenAPI v0.0.38, JWT: ``token``) on a loopback port; yields its
    URL and stops it by its pid. It refuses to run as root: started as root, it drops to ``nobody``
    after opening its socket, so it reads a copy of the cluster's config (no secret in it) from a
    folder every user may read."""
    with tempfile.TemporaryDirectory(prefix="slurmrestd-") as tmp:
        Path(tmp).chmod(0o755)
        conf = Path(tmp) / "slurm.conf"
        shutil.copy(cluster.conf, conf)
        conf.chmod(0o644)
        port = _free_ports(1)[0]
        argv = [shutil.which("slurmrestd", path=os.pathsep.join(["/usr/sbin", os.environ.get("PATH", "")])),
                "-f", str(conf), "-a", "rest_auth/jwt", "-s", "openapi/v0.0.38", "-t", "2",
                *(["-u", "nobody"] if os.geteuid() == 0 else []), f"127.0.0.1:{port}"]
        log = cluster.root / "log" / "slurmrestd.log"
        with log.open("ab") as out:
            # SLURM_JWT=daemon: its calls to slurmctld carry each request's JWT (auth/jwt), not munge's.
            proc = subprocess.Popen(argv, env={**os.environ, "SLURM_CONF": str(conf), "SLURM_JWT": "daemon"},
                                    stdout=out, stderr=subprocess.STDOUT)
        try:
            poll(lambda: proc.poll() is not None or _listening(port), START_LIMIT_S, "slurmrestd to listen")
            if proc.poll() is not None:
                raise RuntimeError(f"slurmrestd exited {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(STOP_LIMIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def token(cluster: SlurmCluster, user: str) -> str:
    """A JWT for ``user`` that slurmctld accepts (``scontrol token``)."""
    return cluster.run("scontrol", "token", f"username={user}", "lifespan=600").stdout.strip().split("=", 1)[1]


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def _daemon(argv: list[str], root: Path, pid_file: Path) -> None:
    """Run a daemon that forks into the background and writes ``pid_file``; wait for the file."""
    proc = subprocess.run(argv, cwd=root, env={**os.environ, "SLURM_CONF": str(root / "slurm.conf")},
                          capture_output=True, text=True, timeout=30)
    if proc.returncode:
        raise RuntimeError(f"{Path(argv[0]).name} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()}"
                           f"\n{_log_tails(root)}")
    poll(lambda: pid_file.is_file() and pid_file.read_text().strip(), 10, f"{pid_file}")


def _log_tails(root: Path, lines: int = 15) -> str:
    parts = []
    for path in sorted([*root.glob("log/*.log"), *root.glob("munge/*.log")]):
        with contextlib.suppress(OSError):
            parts.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
    return "\n".join(parts)


if __name__ == "__main__":  # a cluster to try things against by hand: Ctrl-C stops it
    import sys

    with tempfile.TemporaryDirectory(prefix="slurm-") as tmp, slurm_cluster(Path(tmp)) as c:
        print(f"export SLURM_CONF={c.conf}  # Ctrl-C stops the cluster", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    sys.exit(0)
