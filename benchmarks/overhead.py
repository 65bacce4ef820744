"""How much does the pipeline cost on top of its training job?

Alternates ``trainflow run --summary-json`` (one ``TRAINFLOW_HOME`` kept across the runs, so later
runs are warm) with ``trainflow train`` (a fresh ``--out`` each), and with ``--bare-torchrun`` the
worker under plain ``torch.distributed.run``. Prefect's start-up and teardown are ``process wall -
(imports + flow)`` of the summary's ``timings``. A missed goal never fails the run; a failed run
does. Last line: ``overhead_s=<median pipeline wall - median training wall>``.

``--prefect-mode`` (several, comma-separated, alternate): ``default`` (``trainflow run``'s temporary
API server), ``ephemeral`` (``TRAINFLOW_PREFECT_API=ephemeral``), ``server`` (one ``prefect server
start`` started here, its start-up not charged to the runs; a running ``PREFECT_API_URL`` is reused).

    .venv/bin/python benchmarks/overhead.py --prefect-mode default,ephemeral,server --bare-torchrun
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, free_port, healthy, median, parser, rounds, wait_healthy

from core.env import offline_env
from core.procs import group_members, stop_group
from flows.ui import Server

MODES = ("default", "ephemeral", "server")
STAGES = ("resolve", "validate", "train", "evaluate", "gate", "register")
HEALTH_TIMEOUT_S = 180.0
BIN = Path(sys.executable).parent  # the venv this runs in: its trainflow and prefect


def _descendants(pid: int) -> list[int]:
    """All live descendants of ``pid``, whichever thread started them."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_tree(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop ``proc``'s process group and every descendant, also one that left the group (only ours)."""
    pids = _descendants(proc.pid)
    _signal(pids, signal.SIGTERM)
    stop_group(proc.pid, grace_s)  # started with start_new_session: pgid == pid
    _signal(pids, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _run(cmd: list[str], env: dict[str, str], log: Path, timeout_s: float) -> tuple[int, float, int]:
    """(exit code, wall seconds, processes of its group left behind and killed) of ``cmd``."""
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
    deadline = time.monotonic() + 5  # an ephemeral server may still be on its way out
    while group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = len(group_members(proc.pid))
    if left:
        stop_group(proc.pid, 5)
    return rc, wall, left


def prefect_server(home: Path, base_env: dict[str, str], log: Path) -> Server:
    """``prefect server start`` on 127.0.0.1 with its own database; ``url`` is its API."""
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {**base_env, **offline_env(home), "PREFECT_HOME": str(home / "prefect-server"),
           "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_SERVER_API_PORT": str(port),
           "PREFECT_UI_API_URL": api_url}
    env.pop("PREFECT_API_URL", None)
    Path(env["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    cmd = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port),
           "--analytics-off"]
    return Server("Prefect", api_url, f"{api_url}/health", cmd, env, log)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _next_path(ctx: dict, kind: str) -> Path:
    n = ctx["counter"]
    ctx["counter"] += 1
    return ctx["tmp"] / f"{kind}-{n:02d}"


def run_pipeline(mode: str, args, ctx: dict, tag: str) -> dict:
    base = _next_path(ctx, f"pipeline-{mode}")
    summary_path, log = base.with_suffix(".json"), base.with_suffix(".log")
    rc, wall, left = _run([str(BIN / "trainflow"), "run", "--config", args.config,
                           "--summary-json", str(summary_path)], _mode_env(mode, ctx), log, args.timeout)
    s = _read_json(summary_path)
    tr = s.get("training") or {}
    return {"kind": "pipeline", "mode": mode, "tag": tag, "log": str(log), "rc": rc, "proc_wall": wall,
           "left_behind": left, "wall": wall, "status": s.get("status"),
           "model_version": s.get("model_version"), "timings": s.get("timings") or {},
           "torchrun_wall": tr.get("wall_s"), "samples_per_s": tr.get("samples_per_s"),
           "ok": rc == 0 and s.get("status") == "registered"}


def _mode_env(mode: str, ctx: dict) -> dict[str, str]:
    env = dict(ctx["env"])
    if mode == "ephemeral":
        env["TRAINFLOW_PREFECT_API"] = "ephemeral"
    elif mode == "server":
        env["PREFECT_API_URL"] = ctx["server_url"]
    return env


def run_floor(mode: str, args, ctx: dict, tag: str) -> dict:
    """``benchmarks/empty_flow.py``: the pipeline's Prefect and MLflow start-up around empty stages."""
    log = _next_path(ctx, f"floor-{mode}").with_suffix(".log")
    rc, wall, left = _run([sys.executable, str(ROOT / "benchmarks" / "empty_flow.py")], _mode_env(mode, ctx), log,
                          args.timeout)
    found = [json.loads(x[6:]) for x in log.read_text(errors="replace").splitlines() if x.startswith("FLOOR ")]
    return {"kind": "floor", "mode": mode, "tag": tag, "log": str(log), "rc": rc, "proc_wall": wall, "wall": wall,
            "left_behind": left, "timings": found[0] if found else {}, "ok": rc == 0 and bool(found)}


def run_train(args, ctx: dict, tag: str, bare: bool = False) -> dict:
    kind = "bare" if bare else "train"
    out = _next_path(ctx, kind)  # fresh: a reused folder would resume from its checkpoints
    log = out.with_suffix(".log")
    env = dict(ctx["env"])
    if bare:
        env["OMP_NUM_THREADS"] = str(ctx["threads_per_worker"])  # what the launcher sets
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ctx['nproc']}",
               "-m", "training.worker", "--config", args.config, "--out", str(out)]
    else:
        cmd = [str(BIN / "trainflow"), "train", "--config", args.config, "--out", str(out)]
    rc, wall, left = _run(cmd, env, log, args.timeout)
    result = _read_json(out / "result.json")
    shutil.rmtree(out, ignore_errors=True)
    return {"kind": kind, "tag": tag, "rc": rc, "wall": wall, "proc_wall": wall, "left_behind": left, "log": str(log),
            "status": result.get("status"), "loop_s": result.get("train_wall_s"),
            "samples_per_s": result.get("samples_per_s"), "ok": rc == 0 and result.get("status") == "completed"}


def _fmt(v, width: int = 7) -> str:
    return f"{v:{width}.2f}" if isinstance(v, (int, float)) else " " * (width - 1) + "-"


def _derived(rec: dict) -> dict:
    """The breakdown of one pipeline run (seconds), under the labels the report prints."""
    t, wall, job = rec["timings"], rec["proc_wall"], rec.get("torchrun_wall")
    d = {"process wall (subprocess)": wall, "imports (CLI -> flows.pipeline)": t.get("imports"),
         **{("train (stage)" if st == "train" else st): t.get(st) for st in STAGES},
         "  torchrun job (training.wall_s)": job}
    if t.get("train") is not None and job is not None:
        d["  train stage minus torchrun"] = t["train"] - job
    d["flow (body, all stages)"] = t.get("flow")
    if t.get("flow") is not None:
        d["flow minus its stages"] = t["flow"] - sum(t.get(st) or 0.0 for st in STAGES)
    d["total (CLI t0 -> summary)"] = t.get("total")
    if t.get("imports") is not None and t.get("flow") is not None:
        d["prefect start-up/teardown"] = wall - (t["imports"] + t["flow"])
        if t.get("total") is not None:
            d["  in-process: total - imports - flow"] = t["total"] - t["imports"] - t["flow"]
            d["  outside: wall - total"] = wall - t["total"]
    if t.get("flow") is not None:
        d["stages other than train"] = sum(t.get(st) or 0.0 for st in STAGES if st != "train")
    return d


def report(records: list[dict], modes: list[str], args, ctx: dict) -> float | None:
    def p(*a):
        print(*a, flush=True)

    timed = [r for r in records if r["tag"] != "warm-up"]
    trains = [r for r in timed if r["kind"] == "train"]
    bares = [r for r in timed if r["kind"] == "bare"]
    train_med = median(r["proc_wall"] for r in trains)
    pipe_med: dict[str, float] = {}
    p(f"\n== where the pipeline's wall time goes (seconds; median of {args.repeats}, then each timed run) ==")
    for mode in modes:
        runs = [r for r in timed if r["kind"] == "pipeline" and r["mode"] == mode]
        if not runs:
            continue
        rows = [_derived(r) for r in runs]
        p(f"-- prefect mode: {mode} --")
        p(f"  {'':40s} {'median':>7s}  " + " ".join(f"{'run' + str(i + 1):>7s}" for i in range(len(rows))))
        for k in dict.fromkeys(k for row in rows for k in row):
            p(f"  {k:40s} {_fmt(median(row.get(k) for row in rows))}  " + " ".join(_fmt(row.get(k)) for row in rows))
        if mode == "default":
            p("  (default: 'imports' includes the wait for the server it started"
              " first; Prefect's start-up is then mostly hidden in that)")
        pipe_med[mode] = median(r["proc_wall"] for r in runs)

    p("\n== training only ==")
    p(f"  trainflow train (subprocess wall)        {_fmt(train_med)}  " + " ".join(_fmt(r["proc_wall"]) for r in trains))
    p(f"    its training loop (result train_wall_s){_fmt(median(r.get('loop_s') for r in trains))}")
    if bares:
        bare_med = median(r["proc_wall"] for r in bares)
        p(f"  bare torchrun -m training.worker         {_fmt(bare_med)}  " + " ".join(_fmt(r["proc_wall"]) for r in bares))
        if train_med is not None and bare_med is not None:
            p(f"    trainflow train - bare torchrun        {_fmt(train_med - bare_med)}  (CLI: imports, config, spec)")
    # The torchrun job's wall inside each mode's pipeline runs (median).
    jobs = {m: median(r.get("torchrun_wall") for r in timed if r["kind"] == "pipeline" and r["mode"] == m) for m in modes}
    for mode in modes:
        if jobs[mode] is not None and train_med is not None:
            p(f"  torchrun job inside pipeline [{mode}]  {_fmt(jobs[mode])}  (vs trainflow train: "
              f"{jobs[mode] - train_med:+.2f})")

    overheads = {m: v - train_med for m, v in pipe_med.items() if v is not None and train_med is not None}
    p("\n== overhead = pipeline wall - training wall (medians) ==")
    for mode in [m for m in modes if m in overheads]:
        p(f"  {mode:9s}: pipeline {pipe_med[mode]:6.2f} - training {train_med:6.2f} = overhead {overheads[mode]:6.2f} s"
          f"  (pipeline/training {pipe_med[mode] / train_med if train_med else float('nan'):.2f}x)")
    if len(overheads) > 1 and modes[0] in overheads:
        for mode in [m for m in modes[1:] if m in overheads]:
            p(f"  {mode} vs {modes[0]}: {overheads[mode] - overheads[modes[0]]:+.2f} s")
    if ctx.get("server_ready_s") is not None:
        p(f"  (server mode: `prefect server start` healthy after {ctx['server_ready_s']:.2f} s, once, not charged"
          f"{'; reused an already running server' if ctx.get('server_reused') else ''})")
    warm = [r for r in records if r["tag"] == "warm-up" and r["kind"] == "pipeline"]
    for i, r in enumerate(warm):
        first = " (the first run on this TRAINFLOW_HOME)" if i == 0 and not args.home else ""
        p(f"  warm-up run [{r['mode']}]{first}: wall {r['wall']:.2f} s, not in the medians")
    floors = {m: median(r["proc_wall"] for r in timed if r["kind"] == "floor" and r["mode"] == m) for m in modes}
    if any(v is not None for v in floors.values()):
        p("\n== the floor: benchmarks/empty_flow.py, the same Prefect and MLflow start-up around empty stages ==")
        for mode in [m for m in modes if floors[m] is not None]:
            inside = jobs[mode]
            p(f"  {mode:9s}: empty flow wall {floors[mode]:6.2f}  "
              + " ".join(_fmt(r["proc_wall"]) for r in timed if r["kind"] == "floor" and r["mode"] == mode))
            if inside is not None and train_med is not None and mode in pipe_med:
                least = floors[mode] - (train_med - inside)
                p(f"    pipeline wall - its torchrun job {pipe_med[mode] - inside:6.2f}  (the stages' own work: "
                  f"{pipe_med[mode] - inside - floors[mode]:+.2f})")
                p(f"    least overhead without overlapping the job: empty flow - (trainflow train - torchrun job)"
                  f" = {floors[mode]:.2f} - {train_med - inside:.2f} = {least:.2f} s")
    main = overheads.get(modes[0])
    if main is not None:
        p(f"goal: overhead <= {args.goal:.1f} s [{modes[0]}]: {'met' if main <= args.goal else 'NOT met'} ({main:.1f} s)")
    return main


def _parse_modes(raw: str) -> list[str]:
    modes = [m.strip() for m in raw.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise argparse.ArgumentTypeError(f"--prefect-mode: use one or more of {', '.join(MODES)} (got {raw!r})")
    return list(dict.fromkeys(modes))


def _show(rec: dict) -> None:
    what = rec["kind"] + (f"/{rec['mode']}" if rec["kind"] in ("pipeline", "floor") else "")
    extra = ""
    if rec["kind"] == "pipeline":
        extra = f" {rec.get('status')} v{rec.get('model_version')}"
    elif rec.get("loop_s") is not None:
        extra = f" loop {rec['loop_s']:.2f} s"
    if rec.get("left_behind"):
        extra += f" [killed {rec['left_behind']} leftover process(es)]"
    print(f"  [{rec['tag']:>7s}] {what:20s} wall {rec['wall']:7.2f} s  rc {rec['rc']}{extra}", flush=True)
    if not rec["ok"]:
        print(f"    FAILED; see {rec['log']}", flush=True)
        try:
            for line in Path(rec["log"]).read_text(errors="replace").strip().splitlines()[-8:]:
                print(f"    | {line[:200]}", flush=True)
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--config", default="configs/digits.yaml", help="pipeline YAML, relative to the repo root")
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats of each kind (alternated)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed pipeline runs per mode first, on the same TRAINFLOW_HOME (default 1)")
    ap.add_argument("--prefect-mode", type=_parse_modes, default=["default"],
                    help="default | ephemeral | server, or several comma-separated (alternated; the first one "
                         "gives overhead_s)")
    ap.add_argument("--bare-torchrun", action="store_true",
                    help="also time `python -m torch.distributed.run --standalone ... -m training.worker`")
    ap.add_argument("--floor", action="store_true",
                    help="also time benchmarks/empty_flow.py in each mode: the least a run costs without overlap")
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
        from core.config import load_config
        cfg = load_config(ROOT / args.config, [])  # an absolute --config stays itself
        ctx["nproc"], ctx["threads_per_worker"] = cfg.training.cpu_workers, cfg.training.threads_per_worker
    except Exception:  # noqa: BLE001 - the defaults match configs/digits.yaml; the runs will report a bad config
        pass

    print(f"trainflow overhead: config {args.config}, prefect mode(s) {','.join(modes)}, repeats {args.repeats} "
          f"(+{args.warmup} warm-up per mode), {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start",
          flush=True)
    print(f"  TRAINFLOW_HOME={home}  logs in {tmp}{'' if args.keep else ' (removed at the end)'}", flush=True)

    records: list[dict] = []
    server: Server | None = None
    main_overhead, failed = None, False
    t_start = time.perf_counter()

    def record(rec: dict) -> None:
        _show(rec)
        records.append(rec)

    try:
        if "server" in modes:
            if preset_api:
                if not healthy(preset_api):
                    raise RuntimeError(f"PREFECT_API_URL={preset_api} is set but {preset_api}/health does not answer")
                ctx.update(server_url=preset_api, server_ready_s=0.0, server_reused=True)
            else:
                server, t0 = prefect_server(home, env, tmp / "prefect-server.log"), time.perf_counter()
                server.start()
                if not wait_healthy(server.url, server.proc, HEALTH_TIMEOUT_S):
                    raise RuntimeError(f"prefect server did not become healthy within {HEALTH_TIMEOUT_S:.0f}s "
                                       f"(see {server.log})")
                ctx.update(server_url=server.url, server_ready_s=time.perf_counter() - t0)
                print(f"  prefect server on {server.url}: healthy after {ctx['server_ready_s']:.2f} s", flush=True)
        for mode in modes:
            for _ in range(args.warmup):
                record(run_pipeline(mode, args, ctx, "warm-up"))
                if args.floor:
                    record(run_floor(mode, args, ctx, "warm-up"))
        kinds = [*modes, "train", *(["bare"] if args.bare_torchrun else []),
                 *([f"floor-{m}" for m in modes] if args.floor else [])]
        for i in range(args.repeats):
            tag = f"{i + 1}/{args.repeats}"
            for kind in rounds(kinds, i):
                if kind in ("train", "bare"):
                    record(run_train(args, ctx, tag, bare=kind == "bare"))
                elif kind.startswith("floor-"):
                    record(run_floor(kind[len("floor-"):], args, ctx, tag))
                else:
                    record(run_pipeline(kind, args, ctx, tag))
        main_overhead = report(records, modes, args, ctx)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        failed = True
    except Exception as exc:  # noqa: BLE001 - still print the last line
        print(f"error: {type(exc).__name__}: {exc}", flush=True)
        failed = True
    finally:
        if server is not None:
            t0 = time.perf_counter()
            server.stop()
            print(f"  prefect server stopped in {time.perf_counter() - t0:.2f} s", flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"modes": modes, "records": records,
                                             "server_ready_s": ctx.get("server_ready_s")}, indent=2, default=str))
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"benchmark wall {time.perf_counter() - t_start:.1f} s", flush=True)
    print(f"overhead_s={main_overhead:.1f}" if main_overhead is not None else "overhead_s=nan", flush=True)
    return 1 if failed or not all(r["ok"] for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
