"""Team mode on one machine: PostgreSQL, an MLflow tracking server and a Prefect server.

    python scripts/team.py up   [--dir .trainflow/team] [--pg-port 55432] [--mlflow-port 5000] [--prefect-port 4200]
    python scripts/team.py env  [--dir ...]     # the `export` lines (also in DIR/env.sh)
    python scripts/team.py down [--dir ...]     # stop all three (data stays in DIR)

``up`` initialises a PostgreSQL cluster in ``DIR/postgres`` (trust auth, listening
on 127.0.0.1 and a unix socket inside DIR only) with one database each for MLflow
and Prefect, starts ``mlflow server`` on it with served artifacts in
``DIR/mlartifacts`` (runs and workers upload through HTTP: nothing is shared but
the URL) and ``prefect server start`` on it, waits until all answer, and writes
``DIR/env.sh`` and ``DIR/team.json`` (pids, ports, URLs). Port 0 picks a free one.
Running ``up`` again while the servers live only prints the exports.

PostgreSQL refuses to run as root; as root, its commands run as the ``postgres``
user (or ``TRAINFLOW_PG_USER``), which must be able to reach ``DIR/postgres``
(``--pg-dir`` moves it). ``make team-up`` runs it with the project's venv, whose
``mlflow`` and ``prefect`` it starts (and whose ``core.env`` has the telemetry switches).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from core.env import TELEMETRY_OFF  # the project's venv has trainflow installed
from core.procs import pid_alive

DB_USER = "trainflow"
DATABASES = ("mlflow", "prefect")
BIN = Path(sys.executable).parent


class TeamError(RuntimeError):
    pass


# -- PostgreSQL -----------------------------------------------------------------------
def pg_bindir() -> Path:
    """The folder holding initdb, pg_ctl and createdb (Debian puts them in /usr/lib/postgresql/N/bin)."""
    found = shutil.which("initdb")
    candidates = [Path(os.path.realpath(found)).parent] if found else []
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                                           key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
                                           reverse=True)]
    for folder in candidates:
        if all((folder / tool).is_file() for tool in ("initdb", "pg_ctl", "createdb")):
            return folder
    raise TeamError("PostgreSQL server binaries (initdb, pg_ctl, createdb) not found on PATH or in "
                    "/usr/lib/postgresql/*/bin; install them, e.g. `apt-get install postgresql`")


def pg_runas() -> pwd.struct_passwd | None:
    """None when we are not root; else the account PostgreSQL's commands run as."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("TRAINFLOW_PG_USER", "postgres")
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise TeamError(f"PostgreSQL refuses to run as root and there is no user {name!r} to run it as; "
                        "run as another user or set TRAINFLOW_PG_USER") from None


def _pg(bindir: Path, args: list[str], runas, cwd: Path, check: bool = True, timeout: float = 120):
    kw = {}
    if runas is not None:
        kw = dict(user=runas.pw_uid, group=runas.pw_gid, extra_groups=[])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = env["LANG"] = "C"
    proc = subprocess.run([str(bindir / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise TeamError(f"{args[0]} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()[-2000:]}")
    return proc


def pg_up(pg_dir: Path, port: int) -> dict:
    """Initialise (first time) and start a cluster on 127.0.0.1:port; create the databases."""
    bindir = pg_bindir()
    runas = pg_runas()
    data, sock = pg_dir / "data", pg_dir / "run"
    for folder in (pg_dir, sock):
        folder.mkdir(parents=True, exist_ok=True)
        if runas is not None:
            os.chown(folder, runas.pw_uid, runas.pw_gid)
    os.chmod(pg_dir, 0o700)
    if runas is not None:
        probe = subprocess.run(["test", "-w", str(pg_dir)], user=runas.pw_uid, group=runas.pw_gid,
                               extra_groups=[])
        if probe.returncode != 0:
            raise TeamError(f"user {runas.pw_name!r} cannot reach {pg_dir} (a parent folder is closed to it); "
                            "pass --pg-dir somewhere it can, e.g. under /tmp or /var/lib/postgresql")
    if not (data / "PG_VERSION").is_file():
        _pg(bindir, ["initdb", "-D", str(data), "-U", DB_USER, "-A", "trust", "-E", "UTF8", "--no-locale"],
            runas, pg_dir)
    status = _pg(bindir, ["pg_ctl", "-D", str(data), "status"], runas, pg_dir, check=False)
    if status.returncode != 0:
        opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1"
        _pg(bindir, ["pg_ctl", "-D", str(data), "-l", str(pg_dir / "postgres.log"), "-o", opts,
                     "-w", "-t", "120", "start"], runas, pg_dir, timeout=180)
    for db in DATABASES:
        made = _pg(bindir, ["createdb", "-h", "127.0.0.1", "-p", str(port), "-U", DB_USER, db], runas, pg_dir,
                   check=False)
        if made.returncode != 0 and "already exists" not in made.stderr:
            raise TeamError(f"createdb {db} failed: {made.stderr.strip()}")
    return {"bindir": str(bindir), "data": str(data), "port": port,
            "runas": runas.pw_name if runas else None}


def pg_down(pg: dict) -> None:
    runas = pwd.getpwnam(pg["runas"]) if pg.get("runas") else None
    data = Path(pg["data"])
    if (data / "postmaster.pid").is_file():
        _pg(Path(pg["bindir"]), ["pg_ctl", "-D", str(data), "-m", "fast", "-w", "-t", "60", "stop"],
            runas, data.parent, check=False, timeout=90)


# -- servers --------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(cmd: list[str], env: dict, log: Path, cwd: Path) -> int:
    """Start ``cmd`` in its own session (so ``down`` can stop its whole process group)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return proc.pid


def wait_http(url: str, pid: int, log: Path, timeout: float, name: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            raise TeamError(f"{name} exited during start-up; last lines of {log}:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TeamError(f"{name} did not answer {url} within {timeout:.0f} s; last lines of {log}:\n{_tail(log)}")


def _tail(log: Path, n: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def stop_group(pid: int, grace: float = 20) -> None:
    """SIGTERM the process group led by ``pid``, SIGKILL it after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.2)


def server_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(TELEMETRY_OFF)
    env.update(extra or {})
    return env


def up(team_dir: Path, pg_dir: Path, pg_port: int, mlflow_port: int, prefect_port: int,
       timeout: float = 240) -> dict:
    team_dir.mkdir(parents=True, exist_ok=True)
    state_file = team_dir / "team.json"
    if state_file.is_file():
        state = json.loads(state_file.read_text())
        if all(pid_alive(p) for p in state["pids"].values()):
            return state
        down(team_dir)  # half-dead: start clean
    pg_port, mlflow_port, prefect_port = (p or free_port() for p in (pg_port, mlflow_port, prefect_port))
    state = {"dir": str(team_dir), "pids": {}, "pg": None,
             "mlflow_url": f"http://127.0.0.1:{mlflow_port}", "prefect_api_url": f"http://127.0.0.1:{prefect_port}/api"}
    try:
        state["pg"] = pg_up(pg_dir, pg_port)
        state_file.write_text(json.dumps(state, indent=2))
        db = f"{DB_USER}@127.0.0.1:{pg_port}"
        artifacts = team_dir / "mlartifacts"
        artifacts.mkdir(exist_ok=True)
        mlflow_log = team_dir / "mlflow.log"
        state["pids"]["mlflow"] = _spawn(
            [str(BIN / "mlflow"), "server", "--backend-store-uri", f"postgresql+psycopg2://{db}/mlflow",
             "--serve-artifacts", "--artifacts-destination", str(artifacts.resolve()),
             "--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1"],
            server_env(), mlflow_log, team_dir)
        state_file.write_text(json.dumps(state, indent=2))
        prefect_log = team_dir / "prefect.log"
        state["pids"]["prefect"] = _spawn(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)],
            server_env({"PREFECT_HOME": str((team_dir / "prefect").resolve()),
                        "PREFECT_API_DATABASE_CONNECTION_URL": f"postgresql+asyncpg://{db}/prefect",
                        "PREFECT_UI_API_URL": state["prefect_api_url"],
                        "PREFECT_SERVER_API_PORT": str(prefect_port)}),
            prefect_log, team_dir)
        state_file.write_text(json.dumps(state, indent=2))
        # Both servers migrate their database on first start; on a busy box that takes a while.
        wait_http(f"{state['mlflow_url']}/health", state["pids"]["mlflow"], mlflow_log, timeout, "mlflow server")
        wait_http(f"{state['prefect_api_url']}/health", state["pids"]["prefect"], prefect_log, timeout,
                  "prefect server")
    except BaseException:
        down(team_dir)
        raise
    (team_dir / "env.sh").write_text(exports(state))
    return state


def exports(state: dict) -> str:
    return (f"export MLFLOW_TRACKING_URI={state['mlflow_url']}\n"
            f"export PREFECT_API_URL={state['prefect_api_url']}\n")


def down(team_dir: Path) -> bool:
    """Stop whatever ``team.json`` names (servers first, then PostgreSQL). False when nothing was recorded."""
    state_file = team_dir / "team.json"
    if not state_file.is_file():
        return False
    state = json.loads(state_file.read_text())
    # The Prefect server first: its services would otherwise log connection errors on the way down.
    for name in ("prefect", "mlflow"):
        pid = state["pids"].get(name)
        if pid:
            stop_group(pid)
    if state.get("pg"):
        pg_down(state["pg"])
    state_file.unlink()
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="team.py", description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["up", "down", "env"])
    ap.add_argument("--dir", type=Path, default=Path(".trainflow/team"), help="state folder (default .trainflow/team)")
    ap.add_argument("--pg-dir", type=Path, help="PostgreSQL cluster folder (default DIR/postgres)")
    ap.add_argument("--pg-port", type=int, default=55432)
    ap.add_argument("--mlflow-port", type=int, default=5000)
    ap.add_argument("--prefect-port", type=int, default=4200)
    ap.add_argument("--timeout", type=float, default=240, help="seconds each server may take to answer")
    a = ap.parse_args(argv)
    team_dir = a.dir.resolve()
    try:
        if a.command == "up":
            state = up(team_dir, (a.pg_dir or team_dir / "postgres").resolve(), a.pg_port, a.mlflow_port,
                       a.prefect_port, a.timeout)
            print(f"team mode is up (logs and data in {team_dir}); in your shell:", file=sys.stderr)
            print(exports(state), end="")
        elif a.command == "env":
            state_file = team_dir / "team.json"
            if not state_file.is_file():
                raise TeamError(f"team mode is not up ({state_file} missing); run `make team-up`")
            print(exports(json.loads(state_file.read_text())), end="")
        else:
            print("stopped" if down(team_dir) else f"nothing to stop in {team_dir}", file=sys.stderr)
    except TeamError as exc:
        print(f"team: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
