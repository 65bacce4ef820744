"""The Slurm launcher: a launch plan (``training.plan``) as one batch job, in TorchX's four verbs.

- ``dry_run``: pure; renders the ``sbatch`` script (and the config the workers read) from the plan
  and the config's ``launcher.slurm`` section, so it can be printed and tested without a cluster.
- ``submit``: writes what the dry run rendered into the training folder, ``sbatch --parsable``.
- ``describe``: ``scontrol show job -o`` mapped onto ``STATES`` (PENDING with Slurm's reason,
  RUNNING with its nodes, and the endings).
- ``cancel``: ``scancel``.

With ``launcher.slurm.rest`` the three last go through Slurm's REST API instead (``slurmrestd``,
OpenAPI v0.0.38: ``job/submit``, ``job/{id}`` GET and DELETE), with the same endings.

The job is one task per node; each runs the torchrun agent that the local launcher runs
(``JobSpec.command``), meeting over c10d at the allocation's first node under the job id.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from core.config import SlurmRestConfig
from core.errors import ConfigError, PreemptedError, TrainflowError, TrainingFailedError
from training import preemption
from training.launcher import FATAL_FILE, Hooks, JobSpec, job_env, plan_spec
from training.plan import LaunchPlan

# The states ``describe`` reports; every Slurm job state maps onto one (``SLURM_STATES``).
STATES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "NODE_FAIL", "TIMEOUT", "PREEMPTED", "CANCELLED")
ENDED = frozenset(STATES) - {"PENDING", "RUNNING"}
SLURM_STATES = {
    "PENDING": "PENDING", "CONFIGURING": "PENDING", "REQUEUED": "PENDING", "REQUEUE_HOLD": "PENDING",
    "REQUEUE_FED": "PENDING", "RESV_DEL_HOLD": "PENDING", "SUSPENDED": "PENDING", "STOPPED": "PENDING",
    # Still ending: processes of the job may be alive; the final state follows.
    "RUNNING": "RUNNING", "COMPLETING": "RUNNING", "RESIZING": "RUNNING", "SIGNALING": "RUNNING",
    "STAGE_OUT": "RUNNING", "UPDATE_DB": "RUNNING",
    "COMPLETED": "COMPLETED",
    "FAILED": "FAILED", "OUT_OF_MEMORY": "FAILED", "SPECIAL_EXIT": "FAILED",
    "NODE_FAIL": "NODE_FAIL", "BOOT_FAIL": "NODE_FAIL",
    "TIMEOUT": "TIMEOUT", "DEADLINE": "TIMEOUT",
    "PREEMPTED": "PREEMPTED",
    "CANCELLED": "CANCELLED", "REVOKED": "CANCELLED",
}
SCRIPT_NAME = "slurm.sbatch"
# Each node's output (srun --output; %t: the task, one per node in the allocation's node order: a
# node's host name, %N, need not be unique); the batch script's is slurm-%j.out.
NODE_LOG = "slurm-%j-%t.out"
VISIBLE = ".visible-"  # + node name: written by each node that sees the training folder
SHARED_MARK = "trainflow: shared folder:"
REQUEUE_MARK = "trainflow: requeue:"
# Shell expressions the script fills in on the allocation, in place of these marks in the command.
_ENDPOINT, _RDZV_ID = "@rdzv_endpoint@", "@rdzv_id@"
_COMMENT = re.compile(r"^[A-Za-z0-9._:=,/+-]{0,200}$")


class SlurmError(TrainflowError):
    """Slurm refused a request (``sbatch``, ``scancel``); the message is Slurm's own line."""


class SlurmRefusedError(SlurmError):
    """``sbatch`` refused the job (more nodes than the partition has, an unknown partition or
    account): it can never run as asked; Slurm's reason is the message."""

    exit_code = 2


@dataclass(frozen=True)
class SlurmRequest:
    """What ``submit`` hands Slurm: the batch script and the files it expects in ``out_dir``."""

    script: str
    out_dir: str
    files: dict[str, str]  # name in out_dir -> text (the batch script, the workers' config)
    spec: JobSpec
    # The script's #SBATCH options, {name: value, None for a flag}: what the REST API takes as the
    # job's properties (slurmrestd does not read #SBATCH lines).
    options: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class SlurmStatus:
    job_id: str
    state: str  # one of STATES
    slurm_state: str  # Slurm's own word (COMPLETING, OUT_OF_MEMORY, ...)
    reason: str = ""  # Slurm's reason (why pending, why it failed); "" for None
    nodes: tuple[str, ...] = ()
    exit_code: str = ""  # "CODE:SIGNAL"

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def dry_run(plan: LaunchPlan, out_dir: Path, root: Path, data_md5: str, job_name: str | None = None,
            comment: str = "", rdzv_token: str | None = None, env: dict[str, str] | None = None) -> SlurmRequest:
    """The batch job that runs ``plan`` with the config's ``launcher.slurm`` settings; reads and
    writes nothing. ``out_dir`` (the training folder) and ``root`` (the checkout) must be paths
    every node sees; ``comment`` (e.g. the flow-run and MLflow run ids) is the job's comment.
    ``rdzv_token``: the random part of the rendezvous id (default: drawn), which is
    ``$SLURM_JOB_ID-<token>``: the job id names it, the token keeps it unguessable (agents
    unpickle what the c10d store holds under it). ``env``: variables the workers get beside the plan's.
    ConfigError naming the key when they don't fit."""
    s = plan.cfg.launcher.slurm
    out_dir, root = Path(out_dir), Path(root)
    if not out_dir.is_absolute() or not root.is_absolute():
        raise ConfigError(f"slurm: the training folder and the checkout must be absolute paths, got {out_dir}, {root}")
    if s.shared_dir and not out_dir.is_relative_to(s.shared_dir):
        raise ConfigError(f"launcher.slurm.shared_dir: the training folder {out_dir} is not inside {s.shared_dir}, "
                          "the folder every node sees")
    if not _COMMENT.match(comment):
        raise ConfigError(f"slurm comment: letters, digits and ._:=,/+- only (at most 200), got {comment!r}")
    name = job_name or f"trainflow-{plan.cfg.name}"
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$", name):
        raise ConfigError(f"slurm job name: a slug, got {name!r}")
    token = rdzv_token or secrets.token_hex(8)
    spec = plan_spec(plan, out_dir, root, data_md5, rdzv_endpoint=_ENDPOINT, rdzv_id=_RDZV_ID)
    lo, hi = plan.node_range
    command = spec.command(out_dir / "torchrun")
    command[0] = s.python or ("python" if s.container_image else command[0])
    nodes = f"{lo}-{hi}" if hi > lo else f"{lo}"
    options = {"job-name": name, "nodes": nodes, "ntasks-per-node": "1",
               "time": str(s.time_limit_min), "output": f"{out_dir}/slurm-%j.out", "open-mode": "append",
               "chdir": str(root), "requeue" if s.requeue else "no-requeue": None,
               "partition": s.partition, "account": s.account, "qos": s.qos, "comment": comment or None,
               "gpus-per-node": str(s.gpus_per_node) if s.gpus_per_node else None,
               "signal": f"{s.signal}@{s.signal_before_limit_s}" if s.signal_before_limit_s else None}
    options = {k: v for k, v in options.items() if v is not None or k.endswith("requeue")}
    lines = ["#!/bin/bash", *(f"#SBATCH --{k}" + (f"={v}" if v is not None else "") for k, v in options.items())]
    env = {**(env or {}), **job_env(spec), "TRAINFLOW_SLURM_RDZV_TOKEN": token}
    on_nodes = [f"--nodes={nodes}", "--ntasks-per-node=1"]
    if s.container_image:
        on_nodes += [f"--container-image={s.container_image}", f"--container-workdir={root}"]
        if s.shared_dir:
            on_nodes.append(f"--container-mounts={s.shared_dir}:{s.shared_dir}")
    # One output file per node: the follower streams them and names the node a failure came from.
    srun = ["srun", *on_nodes[:2], "--kill-on-bad-exit=1", f"--output={out_dir}/{NODE_LOG}",
            "--open-mode=append", *on_nodes[2:]]
    out_q = shlex.quote(str(out_dir))
    # Each node writes its name into the training folder: one that does not see it fails the step.
    visible = shlex.quote(f'test -d "$1" && touch "$1/{VISIBLE}$SLURMD_NODENAME" || '
                          f'{{ echo "{SHARED_MARK} $1 is not visible on node $SLURMD_NODENAME" >&2; exit 1; }}')
    preempted = shlex.quote('import json, sys; sys.exit(json.load(open(sys.argv[1]))["status"] != "preempted")')
    lines += [
        "set -uo pipefail",
        "# c10d meets at the allocation's first node (its address: a node's name need not resolve).",
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "addr=$(scontrol -o show node \"$head\" | sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')",
        *(f"export {key}={shlex.quote(value)}" for key, value in sorted(env.items())),
        f'export PYTHONPATH={shlex.quote(str(root))}"${{PYTHONPATH:+:$PYTHONPATH}}"',
        "# The training folder must be the same folder on every node (checkpoints, results).",
        f"if ! srun {' '.join(on_nodes)} /bin/sh -c {visible} sh {out_q}; then",
        f'  echo "{SHARED_MARK} the training folder is not on storage every node of job $SLURM_JOB_ID sees" >&2',
        "  exit 3",
        "fi",
        f"rm -f {out_q}/result.json {out_q}/{FATAL_FILE}",
        "# c10d numbers the nodes by arrival: --node-rank is not used.",
        " ".join([*srun, *(_word(w, {_ENDPOINT: f"$addr:{s.rdzv_port}",
                                     _RDZV_ID: "$SLURM_JOB_ID-$TRAINFLOW_SLURM_RDZV_TOKEN"}) for w in command)]),
        "rc=$?",
        "# Stopped at the warning signal with a checkpoint saved: the requeued job resumes from it.",
        f"if {shlex.quote(command[0])} -c {preempted} {out_q}/result.json 2>/dev/null "
        f'&& [ "${{SLURM_RESTART_COUNT:-0}}" -lt {plan.cfg.training.max_restarts} ]; then',
        f'  echo "{REQUEUE_MARK} job $SLURM_JOB_ID requeued from its checkpoint" >&2',
        '  scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$rc"',
    ]
    script = "\n".join(lines) + "\n"
    return SlurmRequest(script, str(out_dir), {SCRIPT_NAME: script, Path(spec.config_path).name: plan.cfg.to_yaml()},
                        spec, options)


def _word(word: str, expressions: dict[str, str]) -> str:
    """``word`` quoted for the shell, with each mark in it replaced by its (expanded) expression."""
    marks = [m for m in expressions if m in word]
    if not marks:
        return shlex.quote(word)
    if re.search(r"[\"$`\\\s]", word):
        raise ConfigError(f"slurm: cannot quote {word!r} for the batch script")
    for mark in marks:
        word = word.replace(mark, expressions[mark])
    return f'"{word}"'


def _slurm(args: list[str], env: dict[str, str] | None, cwd: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SlurmError(f"{args[0]}: not found; is this a Slurm login node (slurm-client installed)?") from None


def submit(request: SlurmRequest, env: dict[str, str] | None = None, rest: SlurmRestConfig | None = None) -> str:
    """Write the request's files into its training folder and ``sbatch`` its script (or POST it to
    ``rest``); the job id. SlurmRefusedError with Slurm's own line when it refuses (an unknown
    partition, too many nodes). The job gets ``env`` (default: this process's environment)."""
    out = Path(request.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in request.files.items():
        (out / name).write_text(text)
    if rest is not None:
        return _rest_submit(request, dict(os.environ if env is None else env), rest)
    proc = _slurm(["sbatch", "--parsable", str(out / SCRIPT_NAME)], env, cwd=str(out))
    if proc.returncode:
        raise SlurmRefusedError(_one_line(proc.stderr or proc.stdout) or f"sbatch exited {proc.returncode}")
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch --parsable printed {proc.stdout.strip()!r}, not a job id")
    return job_id


def _one_line(text: str) -> str:
    return " ".join(text.split())


def parse_job(text: str) -> SlurmStatus:
    """A ``scontrol show job -o`` line as a SlurmStatus (``nodes`` from its NodeList)."""
    fields = dict(re.findall(r"(\w+)=(\S*)", text))
    if "JobId" not in fields or not fields.get("JobState"):
        raise ValueError(f"not a `scontrol show job -o` line: {text[:200]!r}")
    return _status(fields["JobId"], fields["JobState"], fields.get("Reason", ""), fields.get("NodeList", ""),
                   fields.get("ExitCode", ""))


def _status(job_id: str, raw: str, reason: str, nodes: str, exit_code: str) -> SlurmStatus:
    return SlurmStatus(job_id=job_id, state=SLURM_STATES.get(raw, "FAILED"), slurm_state=raw,
                       reason="" if reason == "None" else reason,
                       nodes=() if nodes in ("", "(null)") else expand_hostlist(nodes), exit_code=exit_code)


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Slurm's compact node list as names: ``gpu[01-03,7],cpu1`` -> gpu01, gpu02, gpu03, gpu7, cpu1."""
    names = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", text):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            names += [f"{prefix}{n:0{width}d}" for n in range(int(lo), int(hi or lo) + 1)]
    return tuple(names)


def describe(job_id: str, env: dict[str, str] | None = None, rest: SlurmRestConfig | None = None
             ) -> SlurmStatus | None:
    """Where job ``job_id`` is, or None once Slurm no longer knows it (after ``MinJobAge``)."""
    if rest is not None:
        return _rest_describe(job_id, rest)
    proc = _slurm(["scontrol", "show", "job", "-o", str(job_id)], env)
    if proc.returncode:
        if "Invalid job id" in proc.stderr:
            return None
        raise SlurmError(_one_line(proc.stderr) or f"scontrol exited {proc.returncode}")
    return parse_job(proc.stdout.splitlines()[0])


def cancel(job_id: str, env: dict[str, str] | None = None, rest: SlurmRestConfig | None = None) -> None:
    """``scancel`` the job; a job that has already ended is left as it is."""
    if rest is not None:
        return _rest_cancel(job_id, rest)
    proc = _slurm(["scancel", str(job_id)], env)
    if proc.returncode and "already completing or completed" not in proc.stderr:
        raise SlurmError(_one_line(proc.stderr) or f"scancel exited {proc.returncode}")


# -- Slurm's REST API (launcher.slurm.rest) --------------------------------------------------------

REST_API = "slurm/v0.0.38"  # the OpenAPI plugin of Slurm 22.05 and later
# #SBATCH option -> the job property it is in the REST API (slurmrestd does not read #SBATCH lines).
_REST_PROPERTIES = {"job-name": "name", "output": "standard_output", "open-mode": "open_mode",
                    "chdir": "current_working_directory", "partition": "partition", "account": "account",
                    "qos": "qos", "comment": "comment", "gpus-per-node": "gpus_per_node", "signal": "signal"}


def _rest(rest: SlurmRestConfig, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    """(HTTP status, JSON answer) of slurmrestd. The JWT comes from the environment variable
    ``rest.token_env`` at each call and goes in no message. SlurmError when it cannot be asked."""
    import getpass
    import urllib.error
    import urllib.request

    token = os.environ.get(rest.token_env)
    if not token:
        raise ConfigError(f"launcher.slurm.rest.token_env: ${rest.token_env} is not set; `scontrol token` "
                          "prints a JWT for it")
    request = urllib.request.Request(
        f"{rest.url}/{REST_API}/{path}", method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"X-SLURM-USER-NAME": rest.user or getpass.getuser(), "X-SLURM-USER-TOKEN": token,
                 "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except OSError as exc:
        raise SlurmError(f"slurmrestd at {rest.url}: {getattr(exc, 'reason', exc)}") from None
    if status in (401, 403):
        raise SlurmError(f"slurmrestd at {rest.url} refused the token in ${rest.token_env} (HTTP {status}); "
                         "`scontrol token` prints a fresh one")
    try:
        answer = json.loads(raw or b"{}")
    except ValueError:
        text = _one_line(raw.decode(errors="replace"))[:200]
        raise SlurmError(f"slurmrestd at {rest.url}: HTTP {status}, not JSON: {text}") from None
    return status, answer if isinstance(answer, dict) else {}


def _rest_errors(answer: dict) -> str:
    """Slurm's errors in the answer, each "error - description" (a refusal has no description)."""
    return "; ".join(" - ".join(str(e[k]) for k in ("error", "description") if e.get(k))
                     for e in answer.get("errors") or [] if isinstance(e, dict))


def rest_job(request: SlurmRequest, environment: dict[str, str], token_env: str) -> dict:
    """The job properties of ``request`` for ``job/submit``: its #SBATCH options, and the submitting
    environment (as sbatch exports it) without the JWT."""
    o = request.options
    lo, _, hi = o["nodes"].partition("-")
    job = {_REST_PROPERTIES[k]: v for k, v in o.items() if k in _REST_PROPERTIES}
    # One task a node; `tasks` too: slurmrestd 22.05 does not apply `nodes` alone.
    job.update(nodes=[int(lo), int(hi or lo)], tasks=int(lo), tasks_per_node=int(o["ntasks-per-node"]),
               time_limit=int(o["time"]), requeue="requeue" in o,
               environment={k: v for k, v in environment.items() if k not in (token_env, "SLURM_JWT")})
    return job


def _rest_submit(request: SlurmRequest, environment: dict[str, str], rest: SlurmRestConfig) -> str:
    status, answer = _rest(rest, "POST", "job/submit",
                           {"script": request.script, "job": rest_job(request, environment, rest.token_env)})
    job_id = answer.get("job_id")
    if status != 200 or not isinstance(job_id, int):
        raise SlurmRefusedError(_rest_errors(answer) or f"slurmrestd: HTTP {status}, no job id")
    return str(job_id)


def _rest_describe(job_id: str, rest: SlurmRestConfig) -> SlurmStatus | None:
    status, answer = _rest(rest, "GET", f"job/{job_id}")
    jobs = [j for j in answer.get("jobs") or [] if isinstance(j, dict)]
    if not jobs:
        if "Invalid job id" in _rest_errors(answer):
            return None
        raise SlurmError(f"slurmrestd: job {job_id}: {_rest_errors(answer) or f'HTTP {status}, no job'}")
    job = jobs[0]
    code = job.get("exit_code")  # a wait status, as scontrol's CODE:SIGNAL
    return _status(str(job.get("job_id", job_id)), str(job.get("job_state") or "FAILED"),
                   str(job.get("state_reason") or ""), str(job.get("nodes") or ""),
                   f"{code >> 8}:{code & 0x7f}" if isinstance(code, int) else "")


def _rest_cancel(job_id: str, rest: SlurmRestConfig) -> None:
    status, answer = _rest(rest, "DELETE", f"job/{job_id}")
    errors = _rest_errors(answer)
    if status != 200 and "already completing or completed" not in errors.lower():
        raise SlurmError(f"slurmrestd: cancelling job {job_id}: {errors or f'HTTP {status}'}")


# -- the launcher: submit the plan, follow the job to its ending -----------------------------------

POLL_S = 0.5
CANCEL_WAIT_S = 60.0


def check_shared_dir(cfg) -> None:
    """Refuse, before anything is submitted, a ``launcher.slurm.shared_dir`` that this host does not
    have (ConfigError naming the path); the nodes check it again when the job starts."""
    shared = cfg.launcher.slurm.shared_dir
    if shared and not Path(shared).is_dir():
        raise ConfigError(f"launcher.slurm.shared_dir: {shared} does not exist here; the training folder must be "
                          "on a path every node of the job sees")


def start(plan: LaunchPlan, out_dir: Path, root: Path, data_md5: str, env: dict[str, str] | None = None,
          comment: str = "", hooks: Hooks = Hooks()) -> SlurmJob:
    """Submit ``plan`` as one batch job (``dry_run`` + ``submit``) and return it, to follow with
    ``SlurmJob.finish``. ``env``: variables the workers get (beside the plan's). Refusals raise
    before anything is queued: ConfigError (settings, a missing shared folder), SlurmRefusedError."""
    check_shared_dir(plan.cfg)
    request = dry_run(plan, Path(out_dir), Path(root), data_md5, comment=comment, env=env)
    s = plan.cfg.launcher.slurm
    job = SlurmJob(request, s.queue_limit_s, plan.cfg.training.max_restarts, hooks, rest=s.rest)
    job.submit()
    return job


@dataclass
class SlurmJob:
    """A submitted job of one run. ``finish`` follows it (state changes and each node's log to
    ``hooks.log``), resubmits it after a TIMEOUT or PREEMPTED ending that saved a checkpoint (up to
    ``max_restarts``), cancels it when the run stops, and returns the training result."""

    request: SlurmRequest
    queue_limit_s: float
    max_restarts: int
    hooks: Hooks
    rest: SlurmRestConfig | None = None  # launcher.slurm.rest: through slurmrestd
    job_ids: list[str] = field(default_factory=list)
    nodes: tuple[str, ...] = ()  # the allocation's, in task order
    started_at: float = field(default_factory=time.perf_counter)
    _offsets: dict[str, int] = field(default_factory=dict)

    @property
    def job_id(self) -> str:
        return self.job_ids[-1]

    @property
    def out(self) -> Path:
        return Path(self.request.out_dir)

    def submit(self) -> None:
        for stale in ("result.json", FATAL_FILE):  # an earlier job's must not pass for this one's
            (self.out / stale).unlink(missing_ok=True)
        job_id = submit(self.request, rest=self.rest)
        self.job_ids.append(job_id)
        try:
            self.hooks.submitted(job_id)
        except BaseException:  # the caller never gets the job to follow: it must not run on
            self._cancel_quietly()
            raise
        self.hooks.log(f"Slurm job {job_id} submitted ({self.out / SCRIPT_NAME})")

    def finish(self, at_result: bool = False) -> dict:
        """Follow the job to its ending; the training result plus ``wall_s``, ``out_dir`` and
        ``launcher`` (name, job id, nodes, final state, requeues). Raises TrainingFailedError (the
        node, rank and traceback), PreemptedError (stopped with the run, or out of restarts) or
        ConfigError (the training folder not shared). ``at_result`` is accepted for the local
        launcher's signature: the job's end is Slurm's to tell."""
        with preemption.handling():  # SIGTERM of this process: cancel the job (_follow)
            try:
                return self._ending(self._follow())
            except BaseException:  # Ctrl-C, the task's cancellation or timeout: the job goes with the run
                self._cancel_quietly()
                raise

    def _follow(self) -> SlurmStatus:
        """Poll until the job ends; a requeued job (same id) is followed on. Returns the final status."""
        last, pending_since = None, None
        while True:
            if preemption.REQUESTED.is_set():  # SIGTERM / Ctrl-C of the run: the job goes with it
                preemption.REQUESTED.clear()
                self._cancel_and_wait()
                raise PreemptedError(f"stopped: Slurm job {self.job_id} cancelled with the run; the next run "
                                     "resumes from its last checkpoint")
            status = describe(self.job_id, rest=self.rest)
            if status is None:
                raise TrainingFailedError(f"Slurm job {self.job_id} is no longer known to Slurm (scontrol)")
            self.nodes = status.nodes or self.nodes
            self._pump_logs()
            if status != last:
                self.hooks.log(_state_line(status))
                last = status
            now = time.monotonic()
            if status.state == "PENDING":
                pending_since = pending_since or now
                if now - pending_since > self.queue_limit_s:
                    self._cancel_and_wait()
                    raise TrainingFailedError(
                        f"Slurm job {self.job_id} still PENDING ({status.reason or 'no reason given'}) after "
                        f"launcher.slurm.queue_limit_s={self.queue_limit_s:g}: cancelled")
            else:
                pending_since = None
            if status.ended:
                self._pump_logs()
                if status.state in ("TIMEOUT", "PREEMPTED") and self._preempted():
                    if len(self.job_ids) <= self.max_restarts:
                        self.hooks.ended(self.job_id)
                        self.hooks.log(f"Slurm job {self.job_id} ended {status.state} with a checkpoint: resubmitted")
                        self.submit()
                        last = None
                        continue
                self.hooks.ended(self.job_id)
                return status
            time.sleep(POLL_S)

    def _ending(self, status: SlurmStatus) -> dict:
        self.nodes = status.nodes or self.nodes
        job = {"name": "slurm", "job_id": self.job_id, "job_ids": list(self.job_ids), "nodes": list(status.nodes),
               "state": status.slurm_state, "requeues": self._requeues()}
        where = f"Slurm job {self.job_id}"
        if status.state == "COMPLETED":
            result = self._result()
            if result is None or result.get("status") != "completed":
                raise TrainingFailedError(f"{where} COMPLETED but wrote no completed {self.out / 'result.json'}")
            return {**result, "wall_s": time.perf_counter() - self.started_at, "out_dir": str(self.out),
                    "launcher": job}
        if status.state == "CANCELLED":
            raise TrainingFailedError(f"{where} was cancelled outside this run ({status.slurm_state}"
                                      + (f", {status.reason}" if status.reason else "") + ")")
        if self._preempted():
            raise PreemptedError(f"{where} ended {status.slurm_state} after its checkpoint, with no restart left "
                                 f"(training.max_restarts={self.max_restarts}): rerun to resume from it")
        if line := self._marked(SHARED_MARK):
            raise ConfigError(f"launcher.slurm.shared_dir: {line.split(SHARED_MARK, 1)[1].strip()}")
        with contextlib.suppress(OSError, ValueError):
            fatal = json.loads((self.out / FATAL_FILE).read_text())
            raise TrainingFailedError(f"training failed on rank {fatal['rank']} ({where}): {fatal['error']}",
                                      rank=fatal["rank"], traceback=fatal.get("traceback", ""))
        from training.launcher import _first_failure

        local, message, tb = _first_failure(self.out / "torchrun")
        node, rank = self._failing_node(message)
        who = " ".join(filter(None, [f"on node {node}" if node else f"on {', '.join(status.nodes) or 'its nodes'}",
                                     f"rank {rank}" if rank is not None else
                                     (f"local rank {local}" if local is not None else "")]))
        detail = f": {message}" if message else f" (exit code {status.exit_code}; see {self.out})"
        raise TrainingFailedError(f"{where} {status.slurm_state} {who}{detail}", rank=rank, traceback=tb)

    def _result(self) -> dict | None:
        try:
            return json.loads((self.out / "result.json").read_text())
        except (OSError, ValueError):
            return None

    def _preempted(self) -> bool:
        return (self._result() or {}).get("status") == "preempted"

    def _logs(self) -> list[Path]:
        return sorted(self.out.glob(f"slurm-{self.job_id}*.out"))

    def _pump_logs(self) -> None:
        """Each node's new log lines (and the batch script's) to ``hooks.log``, prefixed with the node."""
        for path in self._logs():
            node = self._node_of(path) or "batch"
            try:
                with path.open("rb") as f:
                    f.seek(self._offsets.get(str(path), 0))
                    data = f.read()
            except OSError:
                continue
            complete = data[:data.rfind(b"\n") + 1]
            self._offsets[str(path)] = self._offsets.get(str(path), 0) + len(complete)
            for line in complete.decode(errors="replace").splitlines():
                if line.strip():
                    self.hooks.log(f"[{node}] {line}")

    def _node_of(self, path: Path) -> str | None:
        """The node whose log ``path`` is (``slurm-<job>-<task>.out``), None for the batch script's."""
        step = path.stem.removeprefix(f"slurm-{self.job_id}").lstrip("-")
        if not step.isdigit():
            return None
        return self.nodes[int(step)] if int(step) < len(self.nodes) else f"task {step}"

    def _marked(self, mark: str) -> str | None:
        for path in self._logs():
            with contextlib.suppress(OSError):
                for line in path.read_text(errors="replace").splitlines():
                    if mark in line:
                        return line
        return None

    def _requeues(self) -> int:
        return sum(path.read_text(errors="replace").count(REQUEUE_MARK) for path in self._logs()
                   if path.name == f"slurm-{self.job_id}.out")

    def _failing_node(self, message: str) -> tuple[str | None, int | None]:
        """(node, global rank) of the failure torchrun reported in a node's log: the one whose error
        file holds ``message`` (the earliest error, ``_first_failure``), else the first reported.
        A rank's peers fail after it, in their collectives, and are reported on their nodes too."""
        found = []
        for path in self._logs():
            node = self._node_of(path)
            with contextlib.suppress(OSError):
                found += [(node, int(rank), error_file)
                          for rank, error_file in _ROOT_CAUSE.findall(path.read_text(errors="replace")) if node]
        for node, rank, error_file in found:
            with contextlib.suppress(OSError):
                if message and message in Path(error_file).read_text(errors="replace"):
                    return node, rank
        return (found[0][0], found[0][1]) if found else (None, None)

    def _cancel_and_wait(self) -> None:
        cancel(self.job_id, rest=self.rest)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            status = describe(self.job_id, rest=self.rest)
            if status is None or status.ended:
                break
            time.sleep(POLL_S)
        self.hooks.ended(self.job_id)
        self.hooks.log(f"Slurm job {self.job_id} cancelled")

    def _cancel_quietly(self) -> None:
        if not self.job_ids:
            return
        with contextlib.suppress(SlurmError):
            status = describe(self.job_id, rest=self.rest)
            if status is not None and not status.ended:
                self._cancel_and_wait()


# torchrun's failure report: "rank      : 1 (local_rank: 0)", "exitcode  : ...", "error_file: PATH".
_ROOT_CAUSE = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:[^\n]*\n"
                         r"\s*error_file\s*:\s*(\S+)", re.M)


def _state_line(status: SlurmStatus) -> str:
    """``Slurm job 12: PENDING (Resources)``, ``RUNNING on n1, n2``, ``COMPLETED``..."""
    text = f"Slurm job {status.job_id}: {status.slurm_state}"
    if status.state == "PENDING" and status.reason:
        return f"{text} ({status.reason})"
    if status.state == "RUNNING" and status.nodes:
        return f"{text} on {', '.join(status.nodes)}"
    if status.ended and status.reason:
        return f"{text} ({status.reason}, exit code {status.exit_code})"
    return text
