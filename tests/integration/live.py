"""Helpers for tests that start real servers: process groups that are always stopped, HTTP polling,
a working copy of the repository, and scripts/team.py loaded as a module."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import httpx

from tests.conftest import ROOT, VENV_BIN, load_script
from tests.waiting import wait_for

TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def team_script():
    """``scripts/team.py`` (the code behind ``make team-up``) as a module."""
    return load_script("team")


def clean_env(**extra) -> dict[str, str]:
    """This process's environment without any Prefect/MLflow setting (a test harness may have set some),
    with the venv first on PATH (the deployment's pull step runs ``dvc``) plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "TRAINFLOW_"))}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Proc:
    """A background command in its own process group, logging to a file; ``stop()`` kills the group."""

    def __init__(self, cmd: list[str], env: dict, cwd: Path, log: Path):
        self.log = log
        self.cmd = cmd
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self, grace: float = 20) -> None:
        """SIGTERM the group, wait up to ``grace`` s for the leader, then SIGKILL whatever is left."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(wait)
            except subprocess.TimeoutExpired:
                pass


def call(method: str, url: str, timeout: float = 10, **kw) -> httpx.Response:
    """One HTTP request, made again while the server answers 503: Prefect's answer when its sqlite
    database was busy (a worker polls it every second, the scheduler writes every 2 s), where nothing was
    done and a client retries (Prefect's own client does). Any other answer is the caller's to judge."""
    answers: list[httpx.Response] = []

    def answered() -> httpx.Response | None:
        answers.append(httpx.request(method, url, timeout=timeout, **kw))
        return answers[-1] if answers[-1].status_code != 503 else None

    return wait_for(answered, 30, f"{method} {url} to answer other than 503 (database busy)", poll_s=1)


def wait_http(url: str, proc: Proc, timeout: float) -> None:
    """Until ``url`` answers 200; fails early (with the log) if ``proc`` exits."""
    def up() -> bool:
        if proc.popen.poll() is not None:
            raise AssertionError(f"{proc.cmd[:3]} exited ({proc.popen.returncode}):\n{proc.tail()}")
        try:
            return httpx.get(url, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout, f"{url} to answer 200", poll_s=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{proc.tail()}") from None


def wait_flow_run(api: str, flow_run_id: str, timeout: float, worker: Proc | None = None) -> dict:
    """Poll the REST API until the flow run reaches a terminal state; return it."""
    run: dict = {}

    def ended() -> dict | None:
        run.clear()
        run.update(call("GET", f"{api}/flow_runs/{flow_run_id}").json())
        return dict(run) if (run.get("state") or {}).get("type") in TERMINAL else None

    try:
        return wait_for(ended, timeout, f"flow run {flow_run_id} to end", poll_s=1)
    except AssertionError:
        extra = f"\nworker log:\n{worker.tail()}" if worker else ""
        raise AssertionError(f"flow run {flow_run_id} still {run.get('state', {}).get('type')} "
                             f"after {timeout:.0f} s{extra}") from None


def marked_processes(name: str, value: str) -> dict[int, str]:
    """pid -> command line of every live process whose environment has ``name=value`` (a marker
    every descendant of the process that was given it inherits)."""
    needle = f"{name}={value}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if needle not in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                continue
            if Path(f"/proc/{entry}/stat").read_text().split(")")[-1].split()[0] == "Z":
                continue  # exited, waiting to be reaped
            found[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return found


def assert_the_better_promotion_won(client, results: dict) -> None:
    """Two promoters of model ``race`` at once, v2 better than v3 (``results``: version -> what
    ``promote_if`` returned): v2 holds @champion whatever the order, each saw the other's outcome,
    and each confirmed its own."""
    assert str(client.get_registered_model("race").aliases["champion"]) == "2", results
    assert results["2"]["promoted"] is True
    if results["3"]["promoted"]:  # v3 went first: v2 then replaced it, having seen v3 as champion
        assert results["2"]["previous"] == "3"
    else:
        assert results["3"]["previous"] == "2" and "does not beat" in results["3"]["reason"]
    assert all(r["confirmed"] for r in results.values())


def copy_repo(dest: Path) -> Path:
    """A committed copy of this working tree (tracked and untracked, non-ignored files), with its
    in-repo DVC remote but without the pulled data: what a fresh clone of this branch holds."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-qm", "copy"], cwd=dest, check=True)
    return dest
