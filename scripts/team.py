"""Team mode on one machine: PostgreSQL, an MLflow tracking server and a Prefect server, each behind a password.

    python scripts/team.py up   [--dir .trainflow/team] [--pg-port 55432] [--mlflow-port 5000] [--prefect-port 4200]
    python scripts/team.py env  [--dir ...]     # the lines to eval (URLs, and `. DIR/env.sh` for the credentials)
    python scripts/team.py down [--dir ...]     # stop all three (data stays in DIR)
    python scripts/team.py user NAME --model M [--model ...] [--experiment E ...] [--dir ...]
                                                # an MLflow user who may edit only those models/experiments

What ``up`` starts and where each secret goes: docs/team-mode.md. Secrets reach the servers through
their environment, never a command line (every local user can read those) or a log. ``DIR/team.json``
records each server's pid with its start time and command line: ``down`` signals a pid only while it
is still the process ``up`` started.
"""

from __future__ import annotations

import argparse
import base64
import glob
import importlib.util
import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from unittest import mock

from core.env import TELEMETRY_OFF  # the project's venv has trainflow installed
from core.procs import pid_alive, stop_group

DB_USER = "trainflow"
DATABASES = ("mlflow", "mlflow_auth", "prefect")
MLFLOW_USER = "trainflow"  # MLflow's admin account, which the team's clients use
SECRETS_FILE = "secrets.json"
CLIENT_ENV_FILE = "env.sh"
BIN = Path(sys.executable).parent


class TeamError(RuntimeError):
    pass


# -- secrets ---------------------------------------------------------------------------
def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600 from the first byte)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older file keeps its mode through O_CREAT
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def load_secrets(team_dir: Path, create: bool = False) -> dict:
    """The team's secrets from ``DIR/secrets.json``; drawn and written (0600) when ``create`` and absent."""
    path = team_dir / SECRETS_FILE
    if path.is_file():
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise TeamError(f"{path} is readable by others (mode {mode:o}); `chmod 600 {path}`")
        return json.loads(path.read_text())
    if not create:
        raise TeamError(f"team mode is not set up ({path} missing); run `make team-up`")
    drawn = {
        "postgres_password": secrets.token_urlsafe(32),
        "mlflow_username": MLFLOW_USER,
        "mlflow_password": secrets.token_urlsafe(32),
        "mlflow_flask_secret_key": secrets.token_hex(32),
        "prefect_auth_string": f"trainflow:{secrets.token_urlsafe(32)}",
    }
    write_private(path, json.dumps(drawn, indent=2))
    return drawn


def client_env(state: dict, team_secrets: dict) -> dict[str, str]:
    """What a client (trainflow run, a worker, the mlflow/prefect CLIs) needs to use the servers."""
    return {"MLFLOW_TRACKING_URI": state["mlflow_url"],
            "MLFLOW_TRACKING_USERNAME": team_secrets["mlflow_username"],
            "MLFLOW_TRACKING_PASSWORD": team_secrets["mlflow_password"],
            "PREFECT_API_URL": state["prefect_api_url"],
            "PREFECT_API_AUTH_STRING": team_secrets["prefect_auth_string"]}


# -- processes --------------------------------------------------------------------------
def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def proc_identity(pid: int) -> dict | None:
    """What tells process ``pid`` from a later one given the same number: its start time (clock
    ticks since boot), the boot, and its command line. None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return {"start": int(fields[19]), "boot": _boot_id(),
            "cmdline": [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]}


def identity_mismatch(pid: int, recorded: dict | None) -> str | None:
    """Why ``pid`` is not (or cannot be shown to be) the process ``recorded`` describes; None when
    it is. A record without a start time (team.json of an older team.py) proves nothing."""
    if not recorded or "start" not in recorded:
        return "the record predates start-time records"
    now = proc_identity(pid)
    if now is None:
        return "no such live process"
    if now["boot"] != recorded.get("boot"):
        return "recorded in another boot"
    if now["start"] != recorded["start"]:
        return f"it started at tick {now['start']}, the recorded one at {recorded['start']}"
    if "cmdline" in recorded and now["cmdline"] != recorded["cmdline"]:
        return f"its command line is {shlex.join(now['cmdline'])!r}, not {shlex.join(recorded['cmdline'])!r}"
    return None


# -- PostgreSQL -----------------------------------------------------------------------
def pg_bindir() -> Path:
    """The folder holding initdb, pg_ctl, createdb and psql (Debian puts them in /usr/lib/postgresql/N/bin)."""
    found = shutil.which("initdb")
    candidates = [Path(os.path.realpath(found)).parent] if found else []
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                                           key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
                                           reverse=True)]
    for folder in candidates:
        if all((folder / tool).is_file() for tool in ("initdb", "pg_ctl", "createdb", "psql")):
            return folder
    raise TeamError("PostgreSQL server binaries (initdb, pg_ctl, createdb, psql) not found on PATH or in "
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


def _as(runas) -> dict:
    """subprocess's arguments that run a command as ``runas`` (None: as ourselves)."""
    return {} if runas is None else {"user": runas.pw_uid, "group": runas.pw_gid, "extra_groups": []}


def _pg(bindir: Path, args: list[str], runas, cwd: Path, check: bool = True, timeout: float = 120,
        password: str | None = None, stdin: str | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = env["LANG"] = "C"
    if password is not None:
        env["PGPASSWORD"] = password  # the environment: a command line is readable by every local user
    proc = subprocess.run([str(bindir / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, input=stdin, **_as(runas))
    if check and proc.returncode != 0:
        raise TeamError(f"{args[0]} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()[-2000:]}")
    return proc


def pg_up(pg_dir: Path, port: int, password: str) -> dict:
    """Initialise (first time) and start a cluster on 127.0.0.1:port, every connection by
    scram-sha-256 password; create the databases."""
    bindir, runas = pg_bindir(), pg_runas()
    data, sock = pg_dir / "data", pg_dir / "run"
    for folder in (pg_dir, sock):
        folder.mkdir(parents=True, exist_ok=True)
        if runas is not None:
            os.chown(folder, runas.pw_uid, runas.pw_gid)
    os.chmod(pg_dir, 0o700)
    if runas is not None and subprocess.run(["test", "-w", str(pg_dir)], **_as(runas)).returncode != 0:
        raise TeamError(f"user {runas.pw_name!r} cannot reach {pg_dir} (a parent folder is closed to it); "
                        "pass --pg-dir somewhere it can, e.g. under /tmp or /var/lib/postgresql")
    if not (data / "PG_VERSION").is_file():
        pwfile = pg_dir / "initdb-password"
        write_private(pwfile, password + "\n")
        if runas is not None:
            os.chown(pwfile, runas.pw_uid, runas.pw_gid)
        try:
            _pg(bindir, ["initdb", "-D", str(data), "-U", DB_USER, "--auth=scram-sha-256", f"--pwfile={pwfile}",
                         "-E", "UTF8", "--no-locale"], runas, pg_dir)
        finally:
            pwfile.unlink(missing_ok=True)
    status = _pg(bindir, ["pg_ctl", "-D", str(data), "status"], runas, pg_dir, check=False)
    if status.returncode != 0:
        opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1"
        _pg(bindir, ["pg_ctl", "-D", str(data), "-l", str(pg_dir / "postgres.log"), "-o", opts,
                     "-w", "-t", "120", "start"], runas, pg_dir, timeout=180)
    _require_passwords(bindir, data, port, password, runas)
    for db in DATABASES:
        made = _pg(bindir, ["createdb", "-h", "127.0.0.1", "-p", str(port), "-U", DB_USER, db], runas, pg_dir,
                   check=False, password=password)
        if made.returncode != 0 and "already exists" not in made.stderr:
            hint = (f" (the cluster in {pg_dir} has another password than {SECRETS_FILE}: restore that file "
                    f"or move {pg_dir} away)" if "password authentication failed" in made.stderr else "")
            raise TeamError(f"createdb {db} failed: {made.stderr.strip()}{hint}")
    return {"bindir": str(bindir), "data": str(data), "port": port, "runas": runas.pw_name if runas else None}


_TRUST = re.compile(r"(?<=\s)trust(?=\s|$)")


def hba_without_trust(text: str) -> str | None:
    """``pg_hba.conf`` text with every ``trust`` rule asking for a scram-sha-256 password instead;
    None when no rule trusts."""
    out, changed = [], False
    for line in text.splitlines():
        rule, hash_, comment = line.partition("#")
        words = rule.split()
        if words and words[0] in ("local", "host", "hostssl", "hostnossl", "hostgssenc", "hostnogssenc") \
                and "trust" in words[3:]:
            rule, changed = _TRUST.sub("scram-sha-256", rule), True
        out.append(rule + hash_ + comment + "\n")
    return "".join(out) if changed else None


def _require_passwords(bindir: Path, data: Path, port: int, password: str, runas) -> None:
    """Switch a cluster an older team.py made with trust authentication to scram-sha-256: give
    the role its password (while trust still lets us in), then require it everywhere and reload."""
    hba = data / "pg_hba.conf"
    rewritten = hba_without_trust(hba.read_text())
    if rewritten is None:
        return
    # Over stdin, not -c: the password must not appear on a command line.
    _pg(bindir, ["psql", "-h", "127.0.0.1", "-p", str(port), "-U", DB_USER, "-d", "postgres", "-v", "ON_ERROR_STOP=1",
                 "-q", "-f", "-"], runas, data.parent,
        stdin="SET password_encryption = 'scram-sha-256';\n"
              f"ALTER ROLE {DB_USER} PASSWORD '{password}';\n")  # token_urlsafe: no quote to escape
    with open(hba, "w") as out:  # in place: the file keeps its owner (postgres)
        out.write(rewritten)
    _pg(bindir, ["pg_ctl", "-D", str(data), "reload"], runas, data.parent)


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


def _spawn(state: dict, name: str, cmd: list[str], env: dict) -> None:
    """Start server ``name`` in its own session (so ``down`` can stop its whole process group), logging
    to ``DIR/<name>.log``; record its pid and start time in ``team.json`` (its command line once it
    answers: before exec it is ours)."""
    team_dir = Path(state["dir"])
    with open(team_dir / f"{name}.log", "ab") as out:
        proc = subprocess.Popen(cmd, cwd=team_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    identity = proc_identity(proc.pid)
    if identity is not None:
        del identity["cmdline"]
    state["pids"][name], state["identity"][name] = proc.pid, identity
    (team_dir / "team.json").write_text(json.dumps(state, indent=2))


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


def _check_auth(url: str, headers: dict[str, str], name: str, log: Path) -> None:
    """The server refuses a request without credentials and accepts ours: auth is on and ours work."""
    codes = []
    for h in ({}, headers):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=h), timeout=30) as resp:
                codes.append(resp.status)
        except urllib.error.HTTPError as exc:
            codes.append(exc.code)
    if codes != [401, 200]:
        raise TeamError(f"{name} answered {url} with {codes[0]} without credentials and {codes[1]} with "
                        f"the team's (want 401 and 200); last lines of {log}:\n{_tail(log)}")


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def server_env(extra: dict) -> dict:
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "PG"))},
            **TELEMETRY_OFF, **extra}


def _all_ours(state: dict) -> bool:
    pids = state.get("pids") or {}
    return bool(pids) and all(identity_mismatch(pid, state.get("identity", {}).get(name)) is None
                              for name, pid in pids.items())


def up(team_dir: Path, pg_dir: Path, pg_port: int, mlflow_port: int, prefect_port: int,
       timeout: float = 240) -> dict:
    team_dir.mkdir(parents=True, exist_ok=True)
    state_file = team_dir / "team.json"
    if state_file.is_file():
        state = json.loads(state_file.read_text())
        if _all_ours(state):
            return state
        down(team_dir)  # half-dead or stale: start clean
    if importlib.util.find_spec("flask_wtf") is None:
        raise TeamError("mlflow's basic-auth app needs Flask-WTF, which is not installed: "
                        "`pip install -e '.[team]'` (`make install` installs it from requirements/lock-dev.txt)")
    team_secrets = load_secrets(team_dir, create=True)
    pg_port, mlflow_port, prefect_port = (p or free_port() for p in (pg_port, mlflow_port, prefect_port))
    state = {"dir": str(team_dir), "pids": {}, "identity": {}, "pg": None,
             "mlflow_url": f"http://127.0.0.1:{mlflow_port}", "prefect_api_url": f"http://127.0.0.1:{prefect_port}/api"}
    try:
        state["pg"] = pg_up(pg_dir, pg_port, team_secrets["postgres_password"])
        state_file.write_text(json.dumps(state, indent=2))
        # No password in these URLs: the servers' libpq/asyncpg take it from PGPASSWORD.
        db = f"{DB_USER}@127.0.0.1:{pg_port}"
        pg_password = {"PGPASSWORD": team_secrets["postgres_password"]}
        artifacts = team_dir / "mlartifacts"
        artifacts.mkdir(exist_ok=True)
        auth_ini = team_dir / "mlflow-auth.ini"
        write_private(auth_ini, "[mlflow]\n"
                                "default_permission = READ\n"
                                f"database_uri = postgresql+psycopg2://{db}/mlflow_auth\n"
                                f"admin_username = {team_secrets['mlflow_username']}\n"
                                "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                                # One worker: a password change through the API reaches its cache at once,
                                # and a run's many requests skip the PBKDF2 check after the first.
                                "auth_cache_ttl_seconds = 300\n")
        _spawn(state, "mlflow",
               [str(BIN / "mlflow"), "server", "--app-name", "basic-auth",
                "--backend-store-uri", f"postgresql+psycopg2://{db}/mlflow",
                "--serve-artifacts", "--artifacts-destination", str(artifacts.resolve()),
                "--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1"],
               server_env({**pg_password, "MLFLOW_AUTH_CONFIG_PATH": str(auth_ini.resolve()),
                           "MLFLOW_AUTH_ADMIN_PASSWORD": team_secrets["mlflow_password"],
                           "MLFLOW_FLASK_SERVER_SECRET_KEY": team_secrets["mlflow_flask_secret_key"]}))
        _spawn(state, "prefect",
               [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)],
               server_env({**pg_password, "PREFECT_HOME": str((team_dir / "prefect").resolve()),
                           "PREFECT_API_DATABASE_CONNECTION_URL": f"postgresql+asyncpg://{db}/prefect",
                           "PREFECT_UI_API_URL": state["prefect_api_url"],
                           "PREFECT_SERVER_API_PORT": str(prefect_port),
                           "PREFECT_SERVER_API_AUTH_STRING": team_secrets["prefect_auth_string"],
                           # the server's own client calls (UI settings, services) go through the same check
                           "PREFECT_API_AUTH_STRING": team_secrets["prefect_auth_string"]}))
        prefect_user, _, prefect_password = team_secrets["prefect_auth_string"].partition(":")
        for name, base, authed, headers in (
                ("mlflow", state["mlflow_url"], "/api/2.0/mlflow/experiments/search?max_results=1",
                 _basic(team_secrets["mlflow_username"], team_secrets["mlflow_password"])),
                ("prefect", state["prefect_api_url"], "/admin/version", _basic(prefect_user, prefect_password))):
            # Each server migrates its database on first start; on a busy box that takes a while.
            log = team_dir / f"{name}.log"
            wait_http(f"{base}/health", state["pids"][name], log, timeout, f"{name} server")
            _check_auth(base + authed, headers, f"{name} server", log)
        for name, pid in state["pids"].items():  # exec'd long ago: the servers' own command lines now
            now = proc_identity(pid)
            if now is None or state["identity"].get(name) is None or now["start"] != state["identity"][name]["start"]:
                raise TeamError(f"{name} server (pid {pid}) is gone after answering")
            state["identity"][name] = now
        state_file.write_text(json.dumps(state, indent=2))
    except BaseException:
        down(team_dir)
        raise
    write_private(team_dir / CLIENT_ENV_FILE, client_exports(state, team_secrets))
    return state


def _export_lines(env: dict[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())


def client_exports(state: dict, team_secrets: dict) -> str:
    """``DIR/env.sh``: every variable a client needs, credentials included (the file is 0600)."""
    return ("# trainflow team mode: the servers and this team's credentials. Keep it private (0600).\n"
            + _export_lines(client_env(state, team_secrets)))


def exports(state: dict) -> str:
    """What ``up`` and ``env`` print for ``eval``: the URLs, and the credentials by sourcing the 0600
    file rather than printing them (stdout may be a terminal, a log or a screen share)."""
    return (_export_lines({"MLFLOW_TRACKING_URI": state["mlflow_url"], "PREFECT_API_URL": state["prefect_api_url"]})
            + f". {shlex.quote(str(Path(state['dir']) / CLIENT_ENV_FILE))}\n")


def _read_state(team_dir: Path) -> dict:
    state_file = team_dir / "team.json"
    if not state_file.is_file():
        raise TeamError(f"team mode is not up ({state_file} missing); run `make team-up`")
    return json.loads(state_file.read_text())


def down(team_dir: Path) -> bool:
    """Stop whatever ``team.json`` names that is still what ``up`` started (servers first, then
    PostgreSQL). False when nothing was recorded."""
    state_file = team_dir / "team.json"
    if not state_file.is_file():
        return False
    state = json.loads(state_file.read_text())
    # The Prefect server first: its services would otherwise log connection errors on the way down.
    for name in ("prefect", "mlflow"):
        pid = state["pids"].get(name)
        refused = identity_mismatch(pid, state.get("identity", {}).get(name)) if pid else None
        if pid and refused is None:
            # The group id is the leader's pid, which no new process can take while any member lives:
            # once the leader is verified, the group stays ours until it is empty.
            stop_group(pid, 20)
        elif refused is not None and pid_alive(pid):
            print(f"team: {name}: pid {pid} is not the {name} server team-up started ({refused}; "
                  f"recorded in {state_file}); not signalled", file=sys.stderr)
    if state.get("pg"):
        pg_down(state["pg"])
    state_file.unlink()
    return True


def add_user(team_dir: Path, name: str, models: list[str], experiments: list[str]) -> Path:
    """An MLflow user ``name`` (a fresh password) with EDIT on each of ``models`` and ``experiments``
    (created when missing), READ elsewhere; writes and returns ``DIR/users/NAME.env`` (0600). It also
    carries Prefect's one credential, the team's auth string: the guarded worker, not this user,
    bounds what a Prefect caller runs."""
    if not re.fullmatch(r"[a-z][a-z0-9_-]{1,31}", name) or name == MLFLOW_USER:
        raise TeamError(f"user name {name!r}: use [a-z][a-z0-9_-]{{1,31}}, not {MLFLOW_USER!r}")
    if not models and not experiments:
        raise TeamError("name at least one --model or --experiment the user may edit")
    state, team_secrets = _read_state(team_dir), load_secrets(team_dir)
    admin = {"MLFLOW_TRACKING_USERNAME": team_secrets["mlflow_username"],
             "MLFLOW_TRACKING_PASSWORD": team_secrets["mlflow_password"]}
    with mock.patch.dict(os.environ, admin):  # the MLflow clients read the admin's credentials from here only
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException
        from mlflow.server import get_app_client

        from registry.store import ensure_registered_model

        url = state["mlflow_url"]
        auth, client = get_app_client("basic-auth", tracking_uri=url), MlflowClient(url, url)
        password = secrets.token_urlsafe(32)
        try:
            auth.create_user(name, password)
        except MlflowException as exc:
            if "RESOURCE_ALREADY_EXISTS" not in str(exc.error_code):
                raise
            auth.update_user_password(name, password)
        for model in models:
            ensure_registered_model(client, model)
            auth.grant_user_permission(name, "registered_model", model, "EDIT")
        for experiment in experiments:
            found = client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else client.create_experiment(experiment)
            auth.grant_user_permission(name, "experiment", str(experiment_id), "EDIT")
    user_env = {**client_env(state, team_secrets), "MLFLOW_TRACKING_USERNAME": name, "MLFLOW_TRACKING_PASSWORD": password}
    (team_dir / "users").mkdir(mode=0o700, exist_ok=True)
    path = team_dir / "users" / f"{name}.env"
    write_private(path, f"# trainflow team mode: MLflow user {name} (edits {', '.join(models + experiments)}). "
                        "Keep it private (0600).\n" + _export_lines(user_env))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="team.py", description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["up", "down", "env", "user"])
    ap.add_argument("name", nargs="?", help="user: the MLflow user name")
    ap.add_argument("--model", action="append", default=[], help="user: a registered model they may edit")
    ap.add_argument("--experiment", action="append", default=[], help="user: an experiment they may log runs to")
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
            print(f"team mode is up (logs and data in {team_dir}, secrets in {team_dir / SECRETS_FILE}); "
                  "in your shell:", file=sys.stderr)
            print(exports(state), end="")
        elif a.command == "env":
            print(exports(_read_state(team_dir)), end="")
        elif a.command == "user":
            if not a.name:
                raise TeamError("user: name the user (`team.py user NAME --model MODEL`)")
            path = add_user(team_dir, a.name, a.model, a.experiment)
            print(f"team: MLflow user {a.name} may edit {', '.join(a.model + a.experiment)}; their "
                  f"credentials: `. {path}`", file=sys.stderr)
        else:
            print("stopped" if down(team_dir) else f"nothing to stop in {team_dir}", file=sys.stderr)
    except TeamError as exc:
        print(f"team: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
