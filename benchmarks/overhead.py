"""How much does the pipeline cost on top of its training job?

Runs, alternating and side by side in one invocation (the machine is shared, so only
ratios and differences measured together mean anything):

* the whole pipeline: ``trainflow run --summary-json <tmp>`` as a subprocess, with
  ``TRAINFLOW_HOME`` set to one temp folder kept across the repeats (later runs are
  warm: MLflow database, Prefect database, a registered champion), ``MLFLOW_TRACKING_URI``
  unset;
* training only: ``trainflow train --config <cfg> --out <fresh tmp>`` as a subprocess;
* optionally (``--bare-torchrun``) the worker under plain ``python -m torch.distributed.run``.

``overhead = median pipeline wall - median training wall`` (both subprocess walls). It
prints where the pipeline's wall time goes, stage by stage, from the summary JSON's
``timings``; Prefect's start-up/teardown is derived as ``process wall - (imports + flow)``.
The last line is always ``overhead_s=<x>``; a missed goal never makes the exit status
non-zero (a failed run does: its timing would mean nothing).

Prefect modes (``--prefect-mode``, several comma-separated ones are alternated):

* ``default`` (what ``trainflow run`` does): with no ``PREFECT_API_URL``, the CLI starts
  the temporary API server (the uvicorn command Prefect's ephemeral mode runs) *before*
  importing Prefect, imports Prefect, MLflow and the later stages' modules while it boots, and
  stops it at exit (``flows/api_server.py``); the torchrun job starts when the ``train`` task runs.
* ``ephemeral``: Prefect 3's own ephemeral mode (``TRAINFLOW_PREFECT_API=ephemeral``): the
  same server, started by Prefect when the flow starts, after every import.
* ``server``: one ``prefect server start`` on 127.0.0.1 (a free port), started here
  before the runs and stopped at the end, its start-up reported but not charged to the
  runs; ``trainflow run`` gets ``PREFECT_API_URL``. When ``PREFECT_API_URL`` is already
  set, that server is reused (checked with ``/api/health``) and left running.
* ``spawn``: the temporary server started by the caller before the run and stopped after
  it, both charged to the run.

Usage::

    .venv/bin/python benchmarks/overhead.py                        # ephemeral, 2 repeats + 1 warm-up
    .venv/bin/python benchmarks/overhead.py --prefect-mode server
    .venv/bin/python benchmarks/overhead.py --prefect-mode default,ephemeral,server --bare-torchrun --imports
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("default", "ephemeral", "server", "spawn")
STAGES = ("resolve", "validate", "train", "evaluate", "gate", "register")
HEALTH_TIMEOUT_S = 180.0


# -- processes ------------------------------------------------------------------------------
def _python() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _trainflow() -> list[str]:
    venv = ROOT / ".venv" / "bin" / "trainflow"
    if venv.exists():
        return [str(venv)]
    found = shutil.which("trainflow")
    return [found] if found else [_python(), "-m", "flows.cli"]


def _prefect_cli() -> list[str]:
    venv = ROOT / ".venv" / "bin" / "prefect"
    if venv.exists():
        return [str(venv)]
    found = shutil.which("prefect")
    return [found] if found else [_python(), "-m", "prefect"]


def _descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _kill_tree(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, to ``proc``, its process group and every descendant (only ours)."""
    pids = [proc.pid, *_descendants(proc.pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)  # started with start_new_session: pgid == pid
        except (ProcessLookupError, PermissionError):
            pass
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            try:
                proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        if not any(_alive(p) for p in pids):
            break
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _reap_group(pgid: int, grace_s: float = 5.0) -> int:
    """After a run exits: wait briefly for anything left in its process group, then kill it.

    Returns how many processes had to be killed (an ephemeral server left behind, say).
    """
    def members() -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    found.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
        return found

    deadline = time.monotonic() + grace_s
    while members() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = members()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 5
        while members() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not members():
            break
    return len(left)


def _run(cmd: list[str], env: dict[str, str], log: Path, timeout_s: float) -> tuple[int, float, int]:
    """(exit code, wall seconds, processes left behind) of ``cmd``; output goes to ``log``."""
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            rc = 124
        except BaseException:
            _kill_tree(proc)
            raise
        wall = time.perf_counter() - t0
    return rc, wall, _reap_group(proc.pid)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=2) as resp:
            return resp.status == 200
    except (OSError, ValueError):
        return False


def _wait_healthy(proc: subprocess.Popen | None, api_url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        if _healthy(api_url):
            return True
        time.sleep(0.1)
    return False


def _offline_env(home: Path) -> dict[str, str]:
    """The project's offline, telemetry-free variables (what every trainflow process sets)."""
    try:
        from core.env import offline_env
    except ImportError:  # run by a python without the project installed
        sys.path.insert(0, str(ROOT))
        from core.env import offline_env
    return offline_env(home)


class ApiServer:
    """A Prefect API server on 127.0.0.1 that this benchmark starts and stops.

    ``kind="server"``: ``prefect server start`` (services on, UI off) with its own database;
    ``kind="spawn"``: the uvicorn command Prefect's ephemeral mode runs, on the runs' database.
    """

    def __init__(self, kind: str, home: Path, base_env: dict[str, str], log: Path):
        self.kind, self.home, self.log = kind, home, log
        self.port = _free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        env = {**base_env, **_offline_env(home)}
        env.pop("PREFECT_API_URL", None)
        if kind == "server":
            env.update(PREFECT_HOME=str(home / "prefect-server"),  # not the runs' sqlite file
                       PREFECT_SERVER_API_HOST="127.0.0.1", PREFECT_SERVER_API_PORT=str(self.port),
                       PREFECT_UI_API_URL=self.api_url)  # the UI asks the API on this port
            self.cmd = [*_prefect_cli(), "server", "start", "--host", "127.0.0.1", "--port", str(self.port),
                        "--analytics-off"]
        else:
            env.update(PREFECT_UI_ENABLED="0", PREFECT__SERVER_EPHEMERAL="1", PREFECT__SERVER_FINAL="1")
            self.cmd = _server_cmd(self.port)
        Path(env["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.ready_s = self.stop_s = float("nan")

    def start(self) -> None:
        t0 = time.perf_counter()
        self._out = open(self.log, "ab")
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=self.env, stdout=self._out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        if not _wait_healthy(self.proc, self.api_url, HEALTH_TIMEOUT_S):
            self.stop()
            raise RuntimeError(f"{self.kind} API server did not become healthy within {HEALTH_TIMEOUT_S:.0f}s "
                               f"(see {self.log})")
        self.ready_s = time.perf_counter() - t0

    def stop(self) -> None:
        if self.proc is None:
            return
        t0 = time.perf_counter()
        _kill_tree(self.proc, grace_s=15.0)
        self.stop_s = time.perf_counter() - t0
        self.proc = None
        self._out.close()


def _prefect_parent() -> str:
    """Prefect's ``--app-dir`` (the folder holding the prefect package), without importing it."""
    spec = importlib.util.find_spec("prefect")
    if spec and spec.origin:
        return str(Path(spec.origin).parent.parent)
    return subprocess.run([_python(), "-c", "import importlib.util,pathlib;"
                           "print(pathlib.Path(importlib.util.find_spec('prefect').origin).parent.parent)"],
                          capture_output=True, text=True, check=True).stdout.strip()


IMPORT_PROBE = r"""
import json, sys, time
groups = [
    ("before t0: flows.cli (core.config, pydantic)", ["flows.cli"]),
    ("imports: flows.pipeline (prefect)", ["flows.params", "flows.pipeline", "training.preemption"]),
    ("flow start, ephemeral only: prefect.server.api.server", ["prefect.server.api.server"]),
    ("resolve: torch", ["torch"]),
    ("resolve: mlflow + its sqlalchemy tracking store", ["registry.store", "mlflow", "mlflow.store.tracking.sqlalchemy_store"]),
    ("resolve: rest (launcher, distributed, manifest)", ["training.launcher", "training.distributed", "core.manifest"]),
    ("validate: great_expectations (pulls scipy.stats)", ["great_expectations"]),
    ("validate: rest (validation.suite)", ["validation.suite"]),
    ("evaluate: torch.export pt2 loader (sympy)", ["torch.export.pt2_archive._package"]),
    ("evaluate: rest (sklearn, matplotlib, mlflow.pyfunc)", ["evaluation.evaluate", "registry.models", "sklearn.metrics",
                                                            "matplotlib.pyplot", "mlflow.pyfunc"]),
    ("gate/register: evaluation.gates, evaluation.report", ["evaluation.gates", "evaluation.report"]),
]
out = {}
for name, mods in groups:
    t = time.perf_counter()
    for m in mods:
        __import__(m)
    out[name] = time.perf_counter() - t
print("PROBE " + json.dumps(out))
"""


def import_costs(args, ctx: dict) -> None:
    """Seconds each stage spends importing, in the order the pipeline imports (a fresh process per repeat)."""
    env = {**ctx["env"], **_offline_env(ctx["home"])}
    runs = []
    for _ in range(max(1, args.repeats)):
        p = subprocess.run([_python(), "-c", IMPORT_PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300, stdin=subprocess.DEVNULL)
        line = next((x for x in p.stdout.splitlines() if x.startswith("PROBE ")), None)
        if line:
            runs.append(json.loads(line[6:]))
    if not runs:
        print("  import probe failed", flush=True)
        return
    print("", flush=True)
    print(f"== imports each stage pays (seconds, fresh process, in pipeline order; median of {len(runs)}) ==",
          flush=True)
    for name in runs[0]:
        print(f"  {name:55s} {_fmt(_med(r.get(name) for r in runs))}", flush=True)
    print(f"  {'all':55s} {_fmt(_med(sum(r.values()) for r in runs))}", flush=True)


def _server_cmd(port: int) -> list[str]:
    """The uvicorn command Prefect 3.9's ephemeral mode (SubprocessASGIServer) runs."""
    return [_python(), "-m", "uvicorn", "--app-dir", _prefect_parent(), "--factory",
            "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "error", "--lifespan", "on"]


# -- one run of each kind -------------------------------------------------------------------
def run_pipeline(mode: str, args, ctx: dict, tag: str) -> dict:
    tmp, n = ctx["tmp"], ctx["counter"]
    ctx["counter"] += 1
    summary_path = tmp / f"summary-{n:02d}-{mode}.json"
    log = tmp / f"pipeline-{n:02d}-{mode}.log"
    env = dict(ctx["env"])
    rec: dict = {"kind": "pipeline", "mode": mode, "tag": tag, "log": str(log)}
    spawned = None
    t0 = time.perf_counter()
    if mode == "ephemeral":
        env["TRAINFLOW_PREFECT_API"] = "ephemeral"
    elif mode == "server":
        env["PREFECT_API_URL"] = ctx["server_url"]
    elif mode == "spawn":
        spawned = ApiServer("spawn", ctx["home"], ctx["env"], tmp / f"spawn-{n:02d}.log")
        spawned.start()
        env["PREFECT_API_URL"] = spawned.api_url
    argv = ["run", "--config", args.config, "--summary-json", str(summary_path)]
    cmd = [*_trainflow(), *argv]
    try:
        rc, wall, left = _run(cmd, env, log, args.timeout)
    finally:
        if spawned:
            spawned.stop()
    rec.update(rc=rc, proc_wall=wall, left_behind=left, wall=time.perf_counter() - t0)
    if spawned:
        rec.update(server_ready_s=spawned.ready_s, server_stop_s=spawned.stop_s)
    try:
        s = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        s = {}
    rec["status"] = s.get("status")
    rec["model_version"] = s.get("model_version")
    rec["timings"] = s.get("timings") or {}
    tr = s.get("training") or {}
    rec["torchrun_wall"] = tr.get("wall_s")
    rec["samples_per_s"] = tr.get("samples_per_s")
    rec["ok"] = rc == 0 and rec["status"] == "registered"
    return rec


def run_train(args, ctx: dict, tag: str, bare: bool = False) -> dict:
    tmp, n = ctx["tmp"], ctx["counter"]
    ctx["counter"] += 1
    kind = "bare" if bare else "train"
    out = tmp / f"{kind}-{n:02d}"  # fresh: a reused folder would resume from its checkpoints
    log = tmp / f"{kind}-{n:02d}.log"
    env = dict(ctx["env"])
    if bare:
        env["OMP_NUM_THREADS"] = str(ctx["threads_per_worker"])  # what the launcher sets
        cmd = [_python(), "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ctx['nproc']}",
               "-m", "training.worker", "--config", args.config, "--out", str(out)]
    else:
        cmd = [*_trainflow(), "train", "--config", args.config, "--out", str(out)]
    rc, wall, left = _run(cmd, env, log, args.timeout)
    rec = {"kind": kind, "tag": tag, "rc": rc, "wall": wall, "proc_wall": wall, "left_behind": left, "log": str(log)}
    try:
        result = json.loads((out / "result.json").read_text())
    except (OSError, ValueError):
        result = {}
    rec["status"] = result.get("status")
    rec["loop_s"] = result.get("train_wall_s")
    rec["samples_per_s"] = result.get("samples_per_s")
    rec["ok"] = rc == 0 and rec["status"] == "completed"
    shutil.rmtree(out, ignore_errors=True)
    return rec


# -- report ---------------------------------------------------------------------------------
def _med(values) -> float | None:
    vals = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(vals) if vals else None


def _fmt(v, width: int = 7) -> str:
    return f"{v:{width}.2f}" if isinstance(v, (int, float)) else " " * (width - 1) + "-"


def _derived(rec: dict) -> dict:
    """The breakdown of one pipeline run (seconds)."""
    t = rec["timings"]
    d = {"process wall": rec["proc_wall"], "imports": t.get("imports")}
    for st in STAGES:
        d[st] = t.get(st)
    d["  torchrun job (training.wall_s)"] = rec.get("torchrun_wall")
    if t.get("train") is not None and rec.get("torchrun_wall") is not None:
        d["  train stage minus torchrun"] = t["train"] - rec["torchrun_wall"]
    d["flow"] = t.get("flow")
    if t.get("flow") is not None:
        d["flow minus its stages"] = t["flow"] - sum(t.get(st) or 0.0 for st in STAGES)
    d["total"] = t.get("total")
    if t.get("imports") is not None and t.get("flow") is not None:
        d["prefect start-up/teardown"] = rec["proc_wall"] - (t["imports"] + t["flow"])
        if t.get("total") is not None:
            d["  in-process: total - imports - flow"] = t["total"] - t["imports"] - t["flow"]
            d["  outside: wall - total"] = rec["proc_wall"] - t["total"]
    if rec.get("mode") == "spawn":
        d["spawned server ready"] = rec.get("server_ready_s")
        d["spawned server stop"] = rec.get("server_stop_s")
        d["wall incl. spawned server"] = rec["wall"]
    if t.get("flow") is not None:
        non_train = sum(t.get(st) or 0.0 for st in STAGES if st != "train")
        d["stages other than train"] = non_train
    return d


LABELS = {
    "process wall": "process wall (subprocess)",
    "imports": "imports (CLI -> flows.pipeline)",
    "resolve": "resolve",
    "validate": "validate",
    "train": "train (stage)",
    "evaluate": "evaluate",
    "gate": "gate",
    "register": "register",
    "flow": "flow (body, all stages)",
    "flow minus its stages": "flow minus its stages",
    "total": "total (CLI t0 -> summary)",
}


def report(records: list[dict], modes: list[str], args, ctx: dict) -> float | None:
    P = lambda *a: print(*a, flush=True)  # noqa: E731
    timed = [r for r in records if r["tag"] != "warm-up"]
    trains = [r for r in timed if r["kind"] == "train"]
    bares = [r for r in timed if r["kind"] == "bare"]
    train_med = _med(r["proc_wall"] for r in trains)
    P("")
    P(f"== where the pipeline's wall time goes (seconds; median of {args.repeats}, then each timed run) ==")
    overheads: dict[str, float | None] = {}
    for mode in modes:
        runs = [r for r in timed if r["kind"] == "pipeline" and r["mode"] == mode]
        if not runs:
            continue
        rows = [_derived(r) for r in runs]
        keys = list(dict.fromkeys(k for row in rows for k in row))
        P(f"-- prefect mode: {mode} --")
        P(f"  {'':40s} {'median':>7s}  " + " ".join(f"{'run' + str(i + 1):>7s}" for i in range(len(rows))))
        for k in keys:
            P(f"  {LABELS.get(k, k):40s} {_fmt(_med(row.get(k) for row in rows))}  "
              + " ".join(_fmt(row.get(k)) for row in rows))
        if mode == "default":
            P("  (default: 'imports' includes the later stages' imports and the wait for the server it started"
              " first; Prefect's start-up is then mostly hidden in that)")
        wall_key = "wall" if mode == "spawn" else "proc_wall"
        pipe_med = _med(r[wall_key] for r in runs)
        overheads[mode] = pipe_med - train_med if pipe_med is not None and train_med is not None else None

    P("")
    P("== training only ==")
    P(f"  trainflow train (subprocess wall)        {_fmt(train_med)}  "
      + " ".join(_fmt(r["proc_wall"]) for r in trains))
    P(f"    its training loop (result train_wall_s){_fmt(_med(r.get('loop_s') for r in trains))}")
    if bares:
        bare_med = _med(r["proc_wall"] for r in bares)
        P(f"  bare torchrun -m training.worker         {_fmt(bare_med)}  "
          + " ".join(_fmt(r["proc_wall"]) for r in bares))
        if train_med is not None and bare_med is not None:
            P(f"    trainflow train - bare torchrun        {_fmt(train_med - bare_med)}  (CLI: imports, config, spec)")
    for mode in modes:
        inside = _med(r.get("torchrun_wall") for r in timed if r["kind"] == "pipeline" and r["mode"] == mode)
        if inside is not None and train_med is not None:
            P(f"  torchrun job inside pipeline [{mode}]  {_fmt(inside)}  (vs trainflow train: {inside - train_med:+.2f})")

    P("")
    P("== overhead = pipeline wall - training wall (medians) ==")
    for mode in modes:
        runs = [r for r in timed if r["kind"] == "pipeline" and r["mode"] == mode]
        if not runs or overheads.get(mode) is None:
            continue
        wall_key = "wall" if mode == "spawn" else "proc_wall"
        pipe_med = _med(r[wall_key] for r in runs)
        ratio = pipe_med / train_med if train_med else float("nan")
        extra = " (includes starting and stopping the spawned server)" if mode == "spawn" else ""
        P(f"  {mode:9s}: pipeline {pipe_med:6.2f} - training {train_med:6.2f} = overhead {overheads[mode]:6.2f} s"
          f"  (pipeline/training {ratio:.2f}x){extra}")
    if len([m for m in modes if overheads.get(m) is not None]) > 1:
        first = modes[0]
        for mode in modes[1:]:
            if overheads.get(mode) is not None and overheads.get(first) is not None:
                P(f"  {mode} vs {first}: {overheads[mode] - overheads[first]:+.2f} s")
    if ctx.get("server_ready_s") is not None:
        P(f"  (server mode: `prefect server start` healthy after {ctx['server_ready_s']:.2f} s, once, not charged"
          f"{'; reused an already running server' if ctx.get('server_reused') else ''})")
    warm = [r for r in records if r["tag"] == "warm-up" and r["kind"] == "pipeline"]
    for i, r in enumerate(warm):
        first = " (the first run on this TRAINFLOW_HOME)" if i == 0 and not args.home else ""
        P(f"  warm-up run [{r['mode']}]{first}: wall {r['wall']:.2f} s, not in the medians")
    main = overheads.get(modes[0])
    if main is not None:
        met = main <= args.goal
        P(f"goal: overhead <= {args.goal:.1f} s [{modes[0]}]: {'met' if met else 'NOT met'} ({main:.1f} s)")
    return main


# -- main -----------------------------------------------------------------------------------
def _parse_modes(raw: str) -> list[str]:
    modes = [m.strip() for m in raw.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"--prefect-mode: use one or more of {', '.join(MODES)} (got {raw!r})")
    return list(dict.fromkeys(modes))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/digits.yaml", help="pipeline YAML, relative to the repo root")
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats of each kind (alternated)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed pipeline runs per mode first, on the same TRAINFLOW_HOME (default 1)")
    ap.add_argument("--prefect-mode", type=_parse_modes, default=["default"],
                    help="default | ephemeral | server | spawn, or several comma-separated (alternated; the first one "
                         "gives overhead_s)")
    ap.add_argument("--bare-torchrun", action="store_true",
                    help="also time `python -m torch.distributed.run --standalone ... -m training.worker`")
    ap.add_argument("--imports", action="store_true",
                    help="also time, in a fresh process, the imports each stage pays (cheap: ~15 s a repeat)")
    ap.add_argument("--home", type=Path, help="TRAINFLOW_HOME to use and keep (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (logs, summaries, state)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds before one run is killed")
    ap.add_argument("--goal", type=float, default=5.0, help="overhead goal in seconds (reported only)")
    ap.add_argument("--json", type=Path, help="write every run's record here")
    args = ap.parse_args(argv)
    modes = args.prefect_mode

    def _term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, _term)

    tmp = Path(tempfile.mkdtemp(prefix="trainflow-overhead-"))
    home = args.home.resolve() if args.home else tmp / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    preset_api = env.pop("PREFECT_API_URL", None)
    for key in ("MLFLOW_TRACKING_URI", "PREFECT_HOME", "TRAINFLOW_FAULT", "TRAINFLOW_MLFLOW_RUN_ID"):
        env.pop(key, None)
    env["TRAINFLOW_HOME"] = str(home)
    ctx: dict = {"tmp": tmp, "home": home, "env": env, "counter": 0, "nproc": 2, "threads_per_worker": 1}
    try:
        sys.path.insert(0, str(ROOT))
        from core.config import load_config
        cfg = load_config(ROOT / args.config if not Path(args.config).is_absolute() else Path(args.config), [])
        ctx["nproc"], ctx["threads_per_worker"] = cfg.training.cpu_workers, cfg.training.threads_per_worker
    except Exception:  # noqa: BLE001 - the defaults match configs/digits.yaml; the runs will report a bad config
        pass

    load = os.getloadavg()[0]
    print(f"trainflow overhead: config {args.config}, prefect mode(s) {','.join(modes)}, repeats {args.repeats} "
          f"(+{args.warmup} warm-up per mode), {os.cpu_count()} CPUs, load average {load:.2f} at start", flush=True)
    print(f"  TRAINFLOW_HOME={home}  logs in {tmp}{'' if args.keep else ' (removed at the end)'}",
          flush=True)

    records: list[dict] = []
    server: ApiServer | None = None
    failed = False
    main_overhead = None
    t_start = time.perf_counter()

    def show(rec: dict) -> None:
        nonlocal failed
        what = rec["kind"] + (f"/{rec['mode']}" if rec["kind"] == "pipeline" else "")
        extra = ""
        if rec["kind"] == "pipeline":
            extra = f" {rec.get('status')} v{rec.get('model_version')}"
            if rec["mode"] == "spawn":
                extra += f" (server ready {rec['server_ready_s']:.2f} s, stop {rec['server_stop_s']:.2f} s)"
        elif rec.get("loop_s") is not None:
            extra = f" loop {rec['loop_s']:.2f} s"
        if rec.get("left_behind"):
            extra += f" [killed {rec['left_behind']} leftover process(es)]"
        print(f"  [{rec['tag']:>7s}] {what:20s} wall {rec['wall']:7.2f} s  rc {rec['rc']}{extra}", flush=True)
        if not rec["ok"]:
            failed = True
            print(f"    FAILED; see {rec['log']}", flush=True)
            try:
                tail = Path(rec["log"]).read_text(errors="replace").strip().splitlines()[-8:]
                for line in tail:
                    print(f"    | {line[:200]}", flush=True)
            except OSError:
                pass
        records.append(rec)

    try:
        if "server" in modes:
            if preset_api:
                if not _healthy(preset_api):
                    raise RuntimeError(f"PREFECT_API_URL={preset_api} is set but {preset_api}/health does not answer")
                ctx.update(server_url=preset_api, server_ready_s=0.0, server_reused=True)
            else:
                server = ApiServer("server", home, env, tmp / "prefect-server.log")
                server.start()
                ctx.update(server_url=server.api_url, server_ready_s=server.ready_s)
                print(f"  prefect server on {server.api_url}: healthy after {server.ready_s:.2f} s", flush=True)
        for mode in modes:
            for _ in range(args.warmup):
                show(run_pipeline(mode, args, ctx, "warm-up"))
        for i in range(args.repeats):
            tag = f"{i + 1}/{args.repeats}"
            order = ["pipe:" + m for m in modes] + ["train"] + (["bare"] if args.bare_torchrun else [])
            if i % 2:  # ABBA: drift in the machine's load hits every kind alike
                order.reverse()
            for item in order:
                if item == "train":
                    show(run_train(args, ctx, tag))
                elif item == "bare":
                    show(run_train(args, ctx, tag, bare=True))
                else:
                    show(run_pipeline(item.split(":", 1)[1], args, ctx, tag))
        if args.imports:
            import_costs(args, ctx)
        main_overhead = report(records, modes, args, ctx)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        failed = True
    except Exception as exc:  # noqa: BLE001 - still print the last line
        print(f"error: {type(exc).__name__}: {exc}", flush=True)
        failed = True
    finally:
        if server is not None:
            server.stop()
            print(f"  prefect server stopped in {server.stop_s:.2f} s", flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"modes": modes, "records": records,
                                             "server_ready_s": ctx.get("server_ready_s")}, indent=2, default=str))
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"benchmark wall {time.perf_counter() - t_start:.1f} s", flush=True)
    print(f"overhead_s={main_overhead:.1f}" if main_overhead is not None else "overhead_s=nan", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
