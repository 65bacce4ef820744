"""The Slurm launcher: a launch plan (``training.plan``) as one batch job, in TorchX's four verbs.

- ``dry_run``: pure; renders the ``sbatch`` script (and the config the workers read) from the plan
  and the config's ``launcher.slurm`` section, so it can be printed and tested without a cluster.
- ``submit``: writes what the dry run rendered into the training folder, ``sbatch --parsable``.
- ``describe``: ``scontrol show job -o`` mapped onto ``STATES`` (PENDING with Slurm's reason,
  RUNNING with its nodes, and the endings).
- ``cancel``: ``scancel``.

The job is one task per node; each runs the torchrun agent that the local launcher runs
(``JobSpec.command``), meeting over c10d at the allocation's first node under the job id.
"""

from __future__ import annotations

import re
import secrets
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError, TrainflowError
from training.launcher import JobSpec, job_env, plan_spec
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
# Shell expressions the script fills in on the allocation, in place of these marks in the command.
_ENDPOINT, _RDZV_ID = "@rdzv_endpoint@", "@rdzv_id@"
_COMMENT = re.compile(r"^[A-Za-z0-9._:=,/+-]{0,200}$")


class SlurmError(TrainflowError):
    """Slurm refused a request (``sbatch``, ``scancel``); the message is Slurm's own line."""


@dataclass(frozen=True)
class SlurmRequest:
    """What ``submit`` hands Slurm: the batch script and the files it expects in ``out_dir``."""

    script: str
    out_dir: str
    files: dict[str, str]  # name in out_dir -> text (the batch script, the workers' config)
    spec: JobSpec


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
            comment: str = "", rdzv_token: str | None = None) -> SlurmRequest:
    """The batch job that runs ``plan`` with the config's ``launcher.slurm`` settings; reads and
    writes nothing. ``out_dir`` (the training folder) and ``root`` (the checkout) must be paths
    every node sees; ``comment`` (e.g. the flow-run and MLflow run ids) is the job's comment.
    ``rdzv_token``: the random part of the rendezvous id (default: drawn), which is
    ``$SLURM_JOB_ID-<token>``: the job id names it, the token keeps it unguessable (agents
    unpickle what the c10d store holds under it). ConfigError naming the key when they don't fit."""
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
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}",
             f"#SBATCH --nodes={lo}" + (f"-{hi}" if hi > lo else ""), "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --time={s.time_limit_min}", f"#SBATCH --output={out_dir}/slurm-%j.out",
             "#SBATCH --open-mode=append", f"#SBATCH --chdir={root}",
             "#SBATCH --requeue" if s.requeue else "#SBATCH --no-requeue"]
    lines += [f"#SBATCH --{key}={value}" for key, value in
              (("partition", s.partition), ("account", s.account), ("qos", s.qos), ("comment", comment))
              if value]
    if s.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={s.gpus_per_node}")
    if s.signal_before_limit_s:
        lines.append(f"#SBATCH --signal={s.signal}@{s.signal_before_limit_s}")
    env = {**job_env(spec), "TRAINFLOW_SLURM_RDZV_TOKEN": token}
    srun = ["srun", f"--nodes={lo}" + (f"-{hi}" if hi > lo else ""), "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if s.container_image:
        srun += [f"--container-image={s.container_image}", f"--container-workdir={root}"]
        if s.shared_dir:
            srun.append(f"--container-mounts={s.shared_dir}:{s.shared_dir}")
    lines += [
        "set -euo pipefail",
        "# c10d meets at the allocation's first node (its address: a node's name need not resolve).",
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "addr=$(scontrol -o show node \"$head\" | sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')",
        *(f"export {key}={shlex.quote(value)}" for key, value in sorted(env.items())),
        f'export PYTHONPATH={shlex.quote(str(root))}"${{PYTHONPATH:+:$PYTHONPATH}}"',
        "# c10d numbers the nodes by arrival: --node-rank is not used.",
        " ".join([*srun, *(_word(w, {_ENDPOINT: f"$addr:{s.rdzv_port}",
                                     _RDZV_ID: "$SLURM_JOB_ID-$TRAINFLOW_SLURM_RDZV_TOKEN"}) for w in command)]),
    ]
    script = "\n".join(lines) + "\n"
    return SlurmRequest(script, str(out_dir), {SCRIPT_NAME: script, Path(spec.config_path).name: plan.cfg.to_yaml()},
                        spec)


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


def submit(request: SlurmRequest, env: dict[str, str] | None = None) -> str:
    """Write the request's files into its training folder and ``sbatch`` its script; the job id.
    SlurmError with Slurm's own line when it refuses (an unknown partition, too many nodes)."""
    out = Path(request.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in request.files.items():
        (out / name).write_text(text)
    proc = _slurm(["sbatch", "--parsable", str(out / SCRIPT_NAME)], env, cwd=str(out))
    if proc.returncode:
        raise SlurmError(_one_line(proc.stderr or proc.stdout) or f"sbatch exited {proc.returncode}")
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch --parsable printed {proc.stdout.strip()!r}, not a job id")
    return job_id


def _one_line(text: str) -> str:
    return " ".join(text.split())


def parse_job(text: str) -> SlurmStatus:
    """A ``scontrol show job -o`` line as a SlurmStatus (``nodes`` from its NodeList)."""
    fields = dict(re.findall(r"(\w+)=(\S*)", text))
    raw = fields.get("JobState", "")
    if "JobId" not in fields or not raw:
        raise ValueError(f"not a `scontrol show job -o` line: {text[:200]!r}")
    reason = fields.get("Reason", "")
    nodes = fields.get("NodeList", "")
    return SlurmStatus(job_id=fields["JobId"], state=SLURM_STATES.get(raw, "FAILED"), slurm_state=raw,
                       reason="" if reason == "None" else reason,
                       nodes=() if nodes in ("", "(null)") else expand_hostlist(nodes),
                       exit_code=fields.get("ExitCode", ""))


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


def describe(job_id: str, env: dict[str, str] | None = None) -> SlurmStatus | None:
    """Where job ``job_id`` is, or None once Slurm no longer knows it (after ``MinJobAge``)."""
    proc = _slurm(["scontrol", "show", "job", "-o", str(job_id)], env)
    if proc.returncode:
        if "Invalid job id" in proc.stderr:
            return None
        raise SlurmError(_one_line(proc.stderr) or f"scontrol exited {proc.returncode}")
    return parse_job(proc.stdout.splitlines()[0])


def cancel(job_id: str, env: dict[str, str] | None = None) -> None:
    """``scancel`` the job; a job that has already ended is left as it is."""
    proc = _slurm(["scancel", str(job_id)], env)
    if proc.returncode and "already completing or completed" not in proc.stderr:
        raise SlurmError(_one_line(proc.stderr) or f"scancel exited {proc.returncode}")
