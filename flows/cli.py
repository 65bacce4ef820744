"""``trainflow``: the command line; ``trainflow --help`` lists the commands and the exit codes (``EXIT_CODES``)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

from core.config import load_config
from core.env import apply_offline_env
from core.errors import ConfigError, TrainflowError
from core.printable import printable
from core.paths import importable_root, project_root, trainflow_home

EXIT_OK, EXIT_ERROR, EXIT_DATA, EXIT_GATE, EXIT_PREEMPTED = 0, 1, 2, 3, 4
# A bad command line: sysexits' EX_USAGE, not argparse's 2, which is already "data validation failed".
EXIT_USAGE = 64

# What each exit code means, as `trainflow --help` prints it (5 and 6: flows.reproduce's).
EXIT_CODES = (
    (EXIT_OK, "done: registered (run), champion up to date (retrain), weights matched (reproduce)"),
    (EXIT_ERROR, "any other error, one line of cause on stderr (TRAINFLOW_DEBUG=1 adds the traceback)"),
    (EXIT_DATA, "data validation failed: nothing was trained"),
    (EXIT_GATE, "the gate rejected the candidate: nothing was registered"),
    (EXIT_PREEMPTED, "preempted (SIGTERM or SIGHUP): a checkpoint was saved, the next run resumes"),
    (5, "reproduce: the rerun gave other weights"),
    (6, "reproduce: refused, the git commit or the data version is unavailable"),
    (EXIT_USAGE, "a bad command line (unknown command or option, a missing or bad value), or a cluster job "
                 "Slurm can never run (its reason on stderr): nothing ran"),
)


class _Parser(argparse.ArgumentParser):
    """argparse exiting ``EXIT_USAGE`` on a bad command line (its subparsers are of this class too)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


class _Version(argparse.Action):
    """``--version``: the installed package's version, read only when asked (no import cost)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("trainflow")
        except PackageNotFoundError:
            text = "unknown (not installed: pip install -e .)"
        print(f"trainflow {text}")
        parser.exit()


def _one_line_errors(name: str, prefixed: bool = True, also: tuple[type[Exception], ...] = ()):
    """A command's TrainflowError as one line of cause: ``NAME: cause`` and exit 1 when ``prefixed``,
    else the cause alone and the error's own exit code; an error of ``also`` as ``NAME: cause``, exit 1."""
    def wrap(cmd):
        @functools.wraps(cmd)
        def run(args: argparse.Namespace) -> int:
            try:
                return cmd(args)
            except TrainflowError as exc:
                return _fail(f"{name}: {exc}", EXIT_ERROR, exc) if prefixed else _fail(str(exc), exc.exit_code, exc)
            except also as exc:
                return _fail(f"{name}: {exc}", EXIT_ERROR, exc)
        return run
    return wrap


def _config_arg(ap: argparse.ArgumentParser, required: bool = False) -> None:
    ap.add_argument("--config", default=None if required else "configs/digits.yaml", required=required,
                    help="pipeline YAML (default: configs/digits.yaml)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                    help="override one config value, e.g. --set training.epochs=3 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="trainflow", formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, max_help_position=16),
        description="One Prefect flow from DVC-tracked data to an evaluated, registered MLflow model, "
                    "trained with torchrun.\n`trainflow COMMAND --help` shows a command's options.",
        epilog="exit codes:\n" + "\n".join(f"  {code:>2}  {meaning}" for code, meaning in EXIT_CODES))
    ap.add_argument("--version", action=_Version, help="print the installed version and exit")
    sub = ap.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")

    run = sub.add_parser("run", help="validate, train, evaluate, gate and register (Prefect flow)")
    train = sub.add_parser("train", help="train one config with torchrun, without Prefect")
    retrain = sub.add_parser("retrain", help="run the pipeline only if data, config or code moved past the champion")
    for cmd in (run, train, retrain):  # the commands that train
        _config_arg(cmd, required=cmd is train)
        cmd.add_argument("--nproc", type=int, help="workers per node (default: GPUs, else training.cpu_workers)")
        cmd.add_argument("--launcher", choices=["local", "slurm", "kubernetes"],
                         help="where training runs: local (torchrun on this host, the default), slurm (one sbatch "
                              "job; settings in the config's launcher.slurm) or kubernetes")
    for cmd in (run, retrain):  # the Prefect flows
        cmd.add_argument("--summary-json", type=Path, help="write the run summary here")
        cmd.add_argument("--image", help="container image ref (default: TRAINFLOW_IMAGE or 'local')")
        cmd.add_argument("--image-digest", help="container image digest (default: TRAINFLOW_IMAGE_DIGEST)")
        cmd.add_argument("--promotion", choices=["auto", "manual"], help="override registry.promotion")
        cmd.add_argument("--nnodes", type=int, help="nodes of a cluster launcher's job (default 1; needs --nproc)")
    retrain.add_argument("--force", action="store_true", help="train even when the champion is up to date")
    train.add_argument("--out", required=True, type=Path, help="output folder (reused: resumes from its checkpoints)")
    train.add_argument("--nnodes", default="1", metavar="N|MIN:MAX",
                       help="nodes (one torchrun agent each); MIN:MAX is elastic: the job starts with MIN to MAX "
                            "agents and, when one leaves, the rest resume from the last checkpoint (needs a --out "
                            "every node shares)")
    train.add_argument("--node-rank", type=int, default=0, help="this node's rank, 0..nnodes-1 (c10d ranks nodes "
                                                                 "by arrival; this only names the node)")
    train.add_argument("--rdzv-endpoint", help="HOST:PORT all agents meet at (c10d rendezvous, hosted by the agent "
                                               "on that host); needed when --nnodes > 1")
    train.add_argument("--rdzv-id", help="a random id shared by all nodes of one job; needed when --nnodes > 1 "
                                         "(one node: drawn at random)")
    train.add_argument("--force-resume", action="store_true",
                      help="resume from a checkpoint of another config or dataset")

    repro = sub.add_parser("reproduce", help="retrain a registered model from its manifest and compare weights")
    repro.add_argument("ref", help="NAME@ALIAS, NAME/VERSION or an MLflow run id")
    repro.add_argument("--summary-json", type=Path, help="write the comparison here (has reproduced: true/false)")
    repro.add_argument("--root", type=Path, help="the git + DVC repository that trained it (default: the one around the cwd)")
    repro.add_argument("--keep", action="store_true", help="keep the restored checkout (default: only its training output)")

    scale = sub.add_parser("scale", help="measure layouts (processes x threads, GPUs) x batch sizes; recommend one")
    _config_arg(scale)
    scale.add_argument("--batch-sizes", default=None, help="comma-separated per-worker batch sizes (default: the config's)")
    scale.add_argument("--layouts", default=None,
                       help="comma-separated PROCSxTHREADS or NGPU (default: 1xCORES,1x1,CORESx1 on CPU; 1..n GPUs)")
    scale.add_argument("--epochs", type=int, default=3, help="epochs per job (default 3)")
    scale.add_argument("--target-accuracy", type=float, default=0.95, help="val accuracy for time-to-target")
    scale.add_argument("--out", type=Path, help="report folder (default: TRAINFLOW_HOME/scale/<key>)")
    scale.add_argument("--no-prefect", action="store_true", help="run the sweep directly (no flow, no MLflow)")

    k8s = sub.add_parser("k8s-job", help="print a multi-node Kubernetes training job "
                                         "(NetworkPolicy + headless Service + indexed Job)")
    k8s.add_argument("--name", default="trainflow-train", help="Job and Service name (a DNS label)")
    k8s.add_argument("--namespace", default="default")
    k8s.add_argument("--gpus-per-node", type=int, required=True, help="nvidia.com/gpu per pod = workers per node")
    k8s.add_argument("--image", required=True, help="REPO@sha256:... (or REPO:TAG with --image-digest)")
    k8s.add_argument("--image-digest", help="sha256:... of --image")
    k8s.add_argument("--git-repo", required=True, help="repository every pod clones")
    k8s.add_argument("--mlflow-uri", required=True, help="MLflow tracking server, http(s)://")
    k8s.add_argument("--mlflow-secret", help="Kubernetes Secret holding MLFLOW_TRACKING_USERNAME/PASSWORD "
                                             "(a server with basic auth, e.g. team mode)")
    k8s.add_argument("--shared-pvc", default="trainflow-shared", help="ReadWriteMany claim for checkpoints and results")
    k8s.add_argument("--rdzv-id", help="c10d rendezvous id every pod shares (default: drawn at random)")
    launch = sub.add_parser("k8s-launch", help="the launch plan as the config's launcher.kubernetes job (an indexed "
                                               "Job or a Kubeflow TrainJob): printed, or with --submit created and "
                                               "followed")
    launch.add_argument("--nproc", type=int, required=True, help="workers per pod")
    launch.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI"),
                        help="MLflow tracking server, http(s):// (default: $MLFLOW_TRACKING_URI)")
    launch.add_argument("--name", help="job name, a DNS label (default: trainflow-<pipeline name>)")
    launch.add_argument("--submit", action="store_true", help="create it through the Kubernetes API (in a pod: its "
                        "service account; else ~/.kube/config) and follow it to its ending; Ctrl-C deletes it")
    for cmd in (k8s, launch):
        cmd.add_argument("--nnodes", type=int, required=True, help="pods, one torchrun agent each")
        cmd.add_argument("--git-ref", required=True, help="commit every pod checks out")
        cmd.add_argument("--mlflow-run-id", help="MLflow run rank 0 logs into")
        _config_arg(cmd)

    init = sub.add_parser(
        "init", help="track your table with DVC, profile it, write configs/NAME.yaml + its expectations",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Track a CSV or Parquet table with DVC (local cache), profile it into\n"
                    "configs/NAME.expectations.yaml (review and commit it) and write configs/NAME.yaml.\n"
                    "A folder of images (train/<class>/*.png|jpg and test/<class>/*, no --label) is\n"
                    "profiled into configs/NAME.yaml itself (its classes and bounds).\n"
                    "It says what it decided from the data: identifier columns left out, integer\n"
                    "columns taken as categories, how missing values are handled, duplicate rows.\n"
                    "After a schema change (columns added, removed or retyped) run it again: it\n"
                    "updates the data facts and the expectations, keeps your own keys and shows\n"
                    "the diff.")
    init.add_argument("--data", required=True, help="a folder with train + test tables (.csv/.parquet) or one table, "
                      "or one table file, inside the repository")
    init.add_argument("--label", help="the column to predict (a table; not for a folder of images)")
    init.add_argument("--task", help="classification, regression, image_classification or a plugin's; default: "
                           "image_classification for train/<class>/ + test/<class>/ image folders, else classification "
                           "for a text label or an integer one with few values, else regression (a re-run keeps "
                           "the config's)")
    init.add_argument("--name", help="pipeline name [a-z][a-z0-9_-]* (default: the folder or file name)")
    init.add_argument("--test-fraction", type=float,
                      help="test share when one table is split, stratified by class (default 0.2; a re-run keeps "
                           "the config's)")
    init.add_argument("--pretrained", metavar="FOLDER",
                      help="a Hugging Face model folder inside the repository to fine-tune: a table with --label "
                           "becomes text_classification, JSON Lines (text, or prompt + completion) causal_lm")
    init.add_argument("--text-column", help="with --pretrained: the free-text column (default: the longest text)")
    init.add_argument("--lora", action="store_true",
                      help="with --pretrained: fine-tune LoRA adapters (pretrained.lora)")

    ui = sub.add_parser("ui", help="serve the Prefect UI and the MLflow UI on the local state (.trainflow/) "
                                   "until Ctrl-C")
    ui.add_argument("--prefect-port", type=int, metavar="PORT", help="default: 4200 if free, else a free port (0: a free port)")
    ui.add_argument("--mlflow-port", type=int, metavar="PORT", help="default: 5000 if free, else a free port (0: a free port)")
    pool = sub.add_parser("pool", help="create or update a locked process work pool on PREFECT_API_URL's server: "
                                       "its runs execute only as prefect.yaml's deployments, in this checkout")
    pool.add_argument("action", choices=["create"])
    pool.add_argument("name", help="work pool name (prefect.yaml's is 'process')")
    pool.add_argument("--type", default="process", choices=["process", "docker", "kubernetes"],
                      help="process: runs in this checkout; docker/kubernetes: in TRAINFLOW_IMAGE (the GPU pools, "
                           "with --prefect-file deploy/gpu.prefect.yaml); every $ variable of the file must be set")
    pool.add_argument("--base-job-template", type=Path, metavar="JSON",
                      help="start from this template (default: the worker type's own)")
    worker = sub.add_parser("worker", help="a process worker that refuses every flow run that is not one of "
                                           "prefect.yaml's deployments as committed (run it instead of "
                                           "`prefect worker start`)")
    worker.add_argument("--pool", required=True, help="work pool name")
    worker.add_argument("--limit", type=int, help="at most this many flow runs at once")
    for cmd in (pool, worker):
        cmd.add_argument("--prefect-file", default="prefect.yaml", help="deployments file, relative to the checkout")
        cmd.add_argument("--allow-env", action="append", default=[], metavar="NAME",
                         help="an environment variable a flow run may set besides TRAINFLOW_HOME (repeatable)")
        cmd.add_argument("--home-root", type=Path, metavar="DIR",
                         help="a flow run may set TRAINFLOW_HOME to a folder inside DIR (default: it may not)")
    return ap


def _guard(args: argparse.Namespace, values: dict[str, str] | None = None):
    from flows.worker_guard import ALLOWED_RUN_ENV, Guard

    if not os.environ.get("PREFECT_API_URL"):
        raise TrainflowError("PREFECT_API_URL is not set: a worker and its pool live on a Prefect server "
                             "(`prefect server start`, or `trainflow ui`)")
    return Guard(project_root(), args.prefect_file, values, allow_env=ALLOWED_RUN_ENV + tuple(args.allow_env),
                 home_root=args.home_root)


@_one_line_errors("pool", also=(OSError, ValueError, ImportError))  # ImportError: that worker type's package
def cmd_pool(args: argparse.Namespace) -> int:
    apply_offline_env(trainflow_home(project_root()))
    import asyncio

    from flows.worker_guard import create_pool, placeholders, pool_template

    values = {}
    if args.type != "process":  # the values `prefect deploy` filled in, fixed into the guard's command
        names = [n for n in placeholders(project_root() / args.prefect_file) if n != "TRAINFLOW_REPO_DIR"]
        unset = [n for n in names if not os.environ.get(n)]
        if unset:
            raise TrainflowError(f"{', '.join(unset)} not set: the guard of a {args.type} pool compares the "
                                 f"deployments with {args.prefect_file} as `prefect deploy` filled it in")
        values = {n: os.environ[n] for n in names}
    base = json.loads(args.base_job_template.read_text()) if args.base_job_template else None
    asyncio.run(create_pool(args.name, pool_template(_guard(args, values), args.type, base), args.type))
    print(f"work pool {args.name!r} ({args.type}): locked to {args.prefect_file}")
    return EXIT_OK


@_one_line_errors("worker")
def cmd_worker(args: argparse.Namespace) -> int:
    apply_offline_env(trainflow_home(project_root()))
    import asyncio

    from flows.worker_guard import serve

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.pool, _guard(args), args.limit))
    return EXIT_OK


@_one_line_errors("k8s-launch")
def cmd_k8s_launch(args: argparse.Namespace) -> int:
    from core.manifest import read_dvc_file
    from flows.k8s import cluster_plan
    from training import kube

    cfg_path = _resolve_config_path(args.config)
    root = project_root(cfg_path)
    cfg = _checked_config(cfg_path, args.overrides, root)
    plan = cluster_plan(cfg, args.nproc, args.nnodes)
    render = dict(git_ref=args.git_ref, data_md5=read_dvc_file(root, cfg.dataset.dvc_file).md5,
                  mlflow_uri=args.mlflow_uri or "", mlflow_run_id=args.mlflow_run_id)
    name = args.name or f"trainflow-{cfg.name}"[:52].rstrip("-")
    if not args.submit:
        print(kube.to_yaml(kube.dry_run(plan, name=name, **render).manifests), end="")
        return EXIT_OK
    try:
        with _interrupt_on_sigterm():  # the job dies with this command: kube.run deletes it on the way out
            ending, names = kube.run(plan, kube.Kube.connect(), name=name,
                                     on_event=lambda e: print(f"trainflow: k8s: {e.text}", file=sys.stderr, flush=True),
                                     **render)
    except KeyboardInterrupt:
        return _fail("k8s-launch: interrupted; the job was deleted", EXIT_ERROR)
    print(json.dumps({"state": ending.state, "jobs": names, "nodes": list(ending.nodes), "message": ending.message,
                      **({"pod": ending.pod, "rank": ending.rank} if ending.pod else {})}, indent=2))
    return {"COMPLETED": EXIT_OK, "PREEMPTED": EXIT_PREEMPTED, "TIMEOUT": EXIT_PREEMPTED}.get(ending.state, EXIT_ERROR)


@contextlib.contextmanager
def _interrupt_on_sigterm():
    """SIGTERM raises KeyboardInterrupt in here, as Ctrl-C does."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


@_one_line_errors("k8s-job", prefixed=False, also=(ValueError,))
def cmd_k8s_job(args: argparse.Namespace) -> int:
    from flows.k8s import MultiNodeJob, render, to_yaml

    cfg_path = _resolve_config_path(args.config)  # every pod trains this config: a bad one fails here, first
    _checked_config(cfg_path, args.overrides, project_root(cfg_path))
    # The job's fields are the command's options of the same names; a job draws its own rendezvous id.
    manifests = render(MultiNodeJob(**{f.name: getattr(args, f.name) for f in dataclasses.fields(MultiNodeJob)
                                       if f.name != "rdzv_id" or args.rdzv_id is not None}))
    print(to_yaml(manifests), end="")
    return EXIT_OK


def _fail(msg: str, code: int, exc: BaseException | None = None) -> int:
    """One line of cause on stderr; with TRAINFLOW_DEBUG on, also the traceback of ``exc`` (default:
    the exception being handled), when there is one."""
    # Terminal controls from names in the data are shown escaped (the sources escape their newlines).
    print("trainflow: error: " + "\n".join(printable(line) for line in str(msg).split("\n")), file=sys.stderr)
    exc = exc if exc is not None else sys.exception()
    if exc is not None and os.environ.get("TRAINFLOW_DEBUG", "").strip().lower() in ("1", "true", "yes", "on"):
        traceback.print_exception(exc, file=sys.stderr)
    return code


def _checked_config(cfg_path: Path, overrides: list[str], root: Path):
    """The config, and the user's code it names checked without importing it (torch-free, milliseconds):
    ``model.factory``'s module is found and defines the function (``tasks.factory``)."""
    cfg = load_config(cfg_path, overrides)
    if cfg.model.factory is not None:
        from tasks.factory import check_factory

        check_factory(cfg.model.factory, root)
    return cfg


def _resolve_config_path(raw: str) -> Path:
    path = Path(raw)
    return path if path.is_absolute() or path.exists() else project_root() / path


def _project(raw_config: str) -> tuple[Path, Path]:
    """``(config path, repository root)``, with the offline environment set and the root importable (a
    ``model.factory`` or task module in it imports here, in the flow and in torchrun's workers)."""
    cfg_path = _resolve_config_path(raw_config)
    root = project_root(cfg_path)
    apply_offline_env(trainflow_home(root))
    importable_root(root)
    return cfg_path, root


def _early_error(args: argparse.Namespace, exc: Exception, status: str) -> tuple[int, dict, str, Exception]:
    """A run that failed before its flow started: the summary file says so; the result of ``_run_flow``."""
    summary = {"status": status, "exit_code": EXIT_ERROR, "error": str(exc)}
    _write_summary(args.summary_json, summary)
    return EXIT_ERROR, summary, str(exc), exc


def _run_flow(args: argparse.Namespace, which: str) -> tuple[int, dict, str | None, BaseException | None]:
    """Shared by ``run`` and ``retrain``: check the config, start the API server, import, run the
    flow. Returns ``(exit code, summary, error line or None, its exception)``; the summary file is
    written."""
    t0 = time.perf_counter()
    cfg_path, root = _project(args.config)
    overrides = [*args.overrides, *([f"registry.promotion={args.promotion}"] if args.promotion else [])]
    try:  # fail on a bad config before paying for Prefect's start-up
        from flows.params import code_override

        if code_override(overrides):
            raise ConfigError(code_override(overrides))
        cfg = _checked_config(cfg_path, overrides, root)
        from training.plan import parse_nnodes

        parse_nnodes(1 if args.nnodes is None else args.nnodes, args.nproc)  # plan_launch's check, early
        if args.launcher == "slurm":  # before Prefect starts: nothing is registered or submitted
            from training.slurm import check_shared_dir

            check_shared_dir(cfg)
        if args.launcher == "kubernetes":  # the shared volume and a tracking server, before anything starts
            from core.paths import trainflow_home, tracking_uri
            from training.launchers import check_kube_shared_dir

            check_kube_shared_dir(cfg, trainflow_home(root))
            if not tracking_uri(trainflow_home(root)).startswith(("http://", "https://")):
                raise ConfigError("--launcher kubernetes: MLflow is the embedded sqlite store; the pods need a "
                                  "tracking server: set MLFLOW_TRACKING_URI=http(s)://...")
    except TrainflowError as exc:
        return _early_error(args, exc, "config_error")

    from flows.api_server import heartbeats_where_watched, start_api

    # The temporary Prefect API server boots on the other core while Prefect, torch and
    # MLflow import here (None: PREFECT_API_URL names a running server, or opted out).
    server = start_api(Path(os.environ["PREFECT_HOME"]))
    try:  # the config against its task, while the server boots (imports the task's module)
        from tasks import task_for

        task_for(cfg)
    except TrainflowError as exc:
        if server is not None:
            server.stop()
        return _early_error(args, exc, "config_error")

    from flows.params import CONFIG_NAME, DEFAULT_CONFIG, PipelineParams, RetrainParams, ShellInputs, from_shell
    from training import preemption

    preemption.install_handler()  # SIGTERM, SIGHUP: the training stage checkpoints and the run exits 4
    if which == "retrain":
        from flows.retrain import retrain as flow_fn
    else:
        from flows.pipeline import pipeline as flow_fn
    import mlflow  # noqa: F401  (resolve's imports, also overlapping the server's boot)

    t_import = time.perf_counter() - t0
    if server is not None:
        try:
            t_import += server.wait()
        except RuntimeError as exc:
            return _early_error(args, exc, "failed")
    # The shell's inputs reach the flow through from_shell, never as flow parameters (those are
    # what a deployment's form may set); the parameters only name the config for the Prefect UI.
    shell = ShellInputs(cfg_path, tuple(overrides), args.nproc, args.image, args.image_digest, args.launcher,
                        args.nnodes)
    name = cfg_path.name if re.match(CONFIG_NAME, cfg_path.name) else DEFAULT_CONFIG
    params = RetrainParams(config=name, force=args.force) if which == "retrain" else PipelineParams(config=name)
    error = failure = None
    try:
        with from_shell(shell), heartbeats_where_watched():
            summary = flow_fn(params)
        code = EXIT_OK
    except Exception as exc:  # noqa: BLE001 - every failure becomes an exit code and one line
        summary = getattr(exc, "summary", None) or {"status": "failed", "error": str(exc)}
        code = exc.exit_code if isinstance(exc, TrainflowError) else EXIT_ERROR
        error = str(exc) if isinstance(exc, TrainflowError) else f"{type(exc).__name__}: {exc}"
        failure = exc
    summary["exit_code"] = code
    from flows.ui import ui_bases

    # Where the run's pages are now (None: the local state, served by `trainflow ui`).
    summary["ui"] = dict(zip(("prefect", "mlflow"), ui_bases(
        os.environ.get("PREFECT_API_URL"), server is not None, summary.get("tracking_uri"),
        os.environ.get("PREFECT_UI_URL"))))
    summary.setdefault("timings", {})["imports"] = round(t_import, 3)
    summary["timings"]["total"] = round(time.perf_counter() - t0, 3)
    _write_summary(args.summary_json, summary)
    return code, summary, error, failure


def cmd_run(args: argparse.Namespace) -> int:
    code, summary, error, exc = _run_flow(args, "run")
    if summary.get("status") != "config_error":
        _print_summary(summary)
    return _fail(error, code, exc) if error else code


def _write_summary(path: Path | None, summary: dict) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=2, default=str))


def _print_summary(s: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"trainflow: {s.get('status')}", show_header=False)
    m = s.get("manifest") or {}
    if m:
        table.add_row("data", f"{m['data']['dvc_path']} md5 {m['data']['md5']}")
        table.add_row("config", f"{m['config_name']} {m['config_sha256'][:12]}")
    if "validation" in s:
        v = s["validation"]
        warned = f" ({len(v['warnings'])} warning(s), below)" if v.get("warnings") else ""
        table.add_row("validation", ("passed" + warned) if v.get("success")
                      else f"FAILED: {len(v.get('failures', []))} failure(s), below")
    if "training" in s:
        t = s["training"]
        table.add_row("training", f"{t['world_size']}x {t['backend']}, {t['samples_per_s']:,.0f} samples/s, "
                                  f"{t['wall_s']:.1f}s wall")
        from training.goodput import brief

        # One line: the share lost and to what; the seconds are in the summary JSON (training.goodput).
        if goodput := brief(t.get("goodput")):
            table.add_row("goodput", goodput)
        if k := t.get("kept_epoch"):
            table.add_row("kept epoch", f"{k['epoch']} of {k['of']} (best {k['metric']} {k['best_value']:.4f} at "
                                        f"epoch {k['best_epoch']})")
    if s.get("metrics"):
        table.add_row("test", ", ".join(f"{k} {v:.4f}" for k, v in s["metrics"].items()))
    if s.get("baseline"):
        b = s["baseline"]
        table.add_row("baseline", f"{b.get('predictor')}: " + ", ".join(
            f"{k} {v:.4f}" for k, v in b.items() if isinstance(v, (int, float)) and not isinstance(v, bool)))
    if s.get("gbdt") and s["gbdt"].get("primary") in (s.get("metrics") or {}):
        table.add_row(f"vs {(s['gbdt'].get('names') or ['GBDT'])[0]}", gbdt_text(s["metrics"], s["gbdt"]))
    if s.get("gates"):
        failed = [g for g in s["gates"] if not g["passed"]]
        table.add_row("gates", "passed" if not failed else "; ".join(
            f"{g['name']} {g['value']:.4f} (needs {g['op']} {g['threshold']:.4f})" for g in failed))
    if s.get("model_version"):
        table.add_row("registered", registered_text(s))
        promo = s.get("promotion") or {}
        if promo and not promo.get("promoted"):
            table.add_row("promotion", f"not promoted: {promo.get('reason')}")
    if s.get("timings"):
        table.add_row("time (s)", ", ".join(f"{k} {v:.1f}" for k, v in s["timings"].items()))
    Console(stderr=True).print(table)
    v = s.get("validation") or {}
    # What failed, one line each (split.column: what, with the offending values), then the report.
    for f in (v.get("failures") or [])[:MAX_SHOWN]:
        print(f"  FAILED  {printable(f.get('message') or f.get('detail'))}", file=sys.stderr)
    if len(v.get("failures") or []) > MAX_SHOWN:
        print(f"  ... and {len(v['failures']) - MAX_SHOWN} more in the report", file=sys.stderr)
    for w in v.get("warnings") or []:
        print(f"  warning {printable(w.get('message') or w.get('detail'))}", file=sys.stderr)
    from flows.ui import where_to_look

    # Below the table, one line each: a URL or a path is copied whole, never wrapped.
    ui = s.get("ui") or {}
    for label, value in where_to_look(s, ui.get("prefect"), ui.get("mlflow")):
        print(f"{label:<13} {value}", file=sys.stderr)


def registered_text(s: dict) -> str:
    """``name vN @alias, ...``; a version left with no alias (a run registered after it, concurrently,
    took ``@challenger`` before this one read its aliases) says so instead of ending in a bare ``@``."""
    head = f"{s['model_name']} v{s['model_version']}"
    if s.get("aliases"):
        return f"{head} @{', @'.join(s['aliases'])}"
    return f"{head} (no alias: a version registered after it holds @challenger)"


# Validation failures listed under the summary table (all of them are in the report).
MAX_SHOWN = 10


def gbdt_text(metrics: dict, g: dict) -> str:
    """The candidate beside the task's conventional model (``Task.gbdt_names``) on the same split: its
    primary metric, the gap (positive: the candidate is better) and both times (it fits on one thread)."""
    name, model = g["primary"], (g.get("names") or ["", "gradient-boosted trees"])[1]
    gap = (metrics[name] - g[name]) * (1 if g.get("higher_is_better", True) else -1)
    train = f", this model trained in {g['candidate_train_s']:.1f} s" if g.get("candidate_train_s") is not None else ""
    return (f"{name} {g[name]:.4f} for {model} vs {metrics[name]:.4f} here ({'+' if gap >= 0 else ''}{gap:.4f}"
            f" {'better' if gap >= 0 else 'worse'}); fitted in {g['fit_s']:.1f} s on 1 thread{train}")


@_one_line_errors("train", prefixed=False)
def cmd_train(args: argparse.Namespace) -> int:
    cfg_path, root = _project(args.config)
    from core.manifest import read_dvc_file
    from tasks import task_for
    from training.launcher import launch
    from training.plan import host_facts, plan_launch
    from training.probe import measured_plan

    cfg = _checked_config(cfg_path, args.overrides, root)
    task_for(cfg)
    md5 = read_dvc_file(root, cfg.dataset.dvc_file).md5
    plan = plan_launch(cfg, host_facts(cfg, trainflow_home(root)), args.nproc, args.nnodes)
    if plan.unmeasured:  # nothing measured for this config yet: train each layout for an epoch first
        plan = measured_plan(plan, root, md5, trainflow_home(root), lambda m: print(m, file=sys.stderr))
    for reason in plan.reasons:
        print(f"trainflow: plan: {reason}", file=sys.stderr)
    if args.launcher in (None, "local"):
        job = launch(plan, args.out.resolve(), root, md5, force_resume=args.force_resume, node_rank=args.node_rank,
                     rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id)
    else:  # the cluster places the nodes: one job for all of them
        from training.launchers import Hooks, launcher_for

        job = launcher_for(args.launcher).start(plan, args.out.resolve(), root, md5,
                                                hooks=Hooks(log=lambda m: print(f"trainflow: {m}", file=sys.stderr)))
    result = job.finish()
    # Several nodes: "rank0" says where the weights are; "node_copy" marks a node that holds only the result.
    print(json.dumps({k: result.get(k) for k in ("status", "world_size", "restarts", "samples_per_s", "weights_sha256",
                                                 "final", "goodput", "out_dir", "rank0", "node_copy") if k in result
                      or k not in ("rank0", "node_copy")}, indent=2))
    return EXIT_OK


def cmd_retrain(args: argparse.Namespace) -> int:
    code, summary, error, exc = _run_flow(args, "retrain")
    if error:
        if "manifest" in summary:
            _print_summary(summary)
        return _fail(error, code, exc)
    d = summary.get("retrain") or {}
    if d.get("train"):
        print("trainflow: retrain: trained because " + "; ".join(d["reasons"]), file=sys.stderr)
        _print_summary(summary)
    else:
        print(f"trainflow: retrain: {summary['status']}: {d.get('skip_reason')}", file=sys.stderr)
    return code


def cmd_reproduce(args: argparse.Namespace) -> int:
    root = (args.root or project_root()).resolve()
    apply_offline_env(trainflow_home(root))
    from flows.reproduce import EXIT_NOT_REPRODUCED, print_comparison, reproduce

    try:
        summary = reproduce(args.ref, root, keep=args.keep, log=lambda m: print(f"trainflow: {m}", file=sys.stderr))
    except TrainflowError as exc:
        _write_summary(args.summary_json, {"reproduced": False, "status": "refused", "ref": args.ref,
                                           "exit_code": exc.exit_code, "error": str(exc)})
        return _fail(str(exc), exc.exit_code, exc)
    _write_summary(args.summary_json, summary)
    print_comparison(summary)
    return EXIT_OK if summary["reproduced"] else EXIT_NOT_REPRODUCED


@_one_line_errors("scale", prefixed=False, also=(ValueError,))
def cmd_scale(args: argparse.Namespace) -> int:
    cfg_path, root = _project(args.config)
    _checked_config(cfg_path, args.overrides, root)
    from flows import scale
    from training.probe import parse_layout

    batches = [int(b) for b in args.batch_sizes.split(",")] if args.batch_sizes else None
    layouts = [parse_layout(x) for x in args.layouts.split(",")] if args.layouts else None
    kwargs = dict(layouts=layouts, batch_sizes=batches, epochs=args.epochs,
                  target_accuracy=args.target_accuracy, out_dir=str(args.out) if args.out else None)
    if args.no_prefect:
        report = scale.run_sweep(str(cfg_path), args.overrides, log=lambda m: print(m, file=sys.stderr), **kwargs)
    else:
        report = scale.scale_flow(str(cfg_path), args.overrides, **kwargs)
    print(Path(report["files"]["md"]).read_text())
    print(json.dumps(report["files"], indent=2))
    return EXIT_OK


@_one_line_errors("init")
def cmd_init(args: argparse.Namespace) -> int:
    from flows.init import InitError, format_report, init_project
    from flows.init_pretrained import FolderRefusedError, format_pretrained_report, init_pretrained

    if args.pretrained is None:
        if args.text_column is not None or args.lora:
            raise InitError("--text-column and --lora go with --pretrained")
        print(format_report(init_project(project_root(), Path(args.data).resolve(), args.label, args.task, args.name,
                                         args.test_fraction)))
        return EXIT_OK
    if args.task is not None:
        raise InitError("--task: --pretrained picks text_classification (a table) or causal_lm (JSON Lines)")
    try:
        result = init_pretrained(project_root(), Path(args.data).resolve(), Path(args.pretrained).resolve(),
                                 args.label, args.name, args.text_column, args.test_fraction, args.lora)
    except FolderRefusedError as exc:  # a refused model folder is bad input data, like a refused table
        return _fail(f"init: {exc}", EXIT_DATA)
    print(format_pretrained_report(result))
    return EXIT_OK


@_one_line_errors("ui")
def cmd_ui(args: argparse.Namespace) -> int:
    apply_offline_env(trainflow_home(project_root()))
    from flows.ui import servers_for, serve

    servers, elsewhere = servers_for(trainflow_home(project_root()), args.prefect_port, args.mlflow_port)
    return serve(servers, elsewhere, out=lambda line: print(line, flush=True))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code = {"run": cmd_run, "train": cmd_train, "retrain": cmd_retrain, "reproduce": cmd_reproduce, "scale": cmd_scale,
            "k8s-job": cmd_k8s_job, "k8s-launch": cmd_k8s_launch, "init": cmd_init, "ui": cmd_ui, "pool": cmd_pool,
            "worker": cmd_worker}[args.command](args)
    # Everything alive now lives until exit: out of the collector's reach, interpreter shutdown does
    # not traverse Prefect's, MLflow's and torch's objects.
    gc.freeze()
    return code

if __name__ == "__main__":
    sys.exit(main())
