"""The launch plan: how many nodes and workers, which strategy, how many threads, and why, decided
once by ``plan_launch`` from the config, this host's facts and the command line. A launcher only
formats a plan (``training.launcher.make_spec`` for torchrun on this host); nothing else sizes the
world."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from core.config import PipelineConfig, config_from_dict
from core.errors import ConfigError
from core.manifest import World
from training import advisor
from training.layouts import MODEL_PARALLEL, check_world, maybe_gpu


@dataclass(frozen=True)
class HostFacts:
    """What the plan needs to know of the host and the model; gathered by ``host_facts``, or given."""

    gpus: int = 0  # CUDA devices the job may use (0 with training.backend gloo)
    device_bytes: int = 0  # one device's memory: GPU 0's, else this host's RAM
    cpu_count: int = 1
    sweep: list[dict] | None = None  # rows `trainflow scale` or the probe measured for this config
    model: dict | None = None  # advisor.model_size, where a rule for "auto" needs it


@dataclass(frozen=True)
class LaunchPlan:
    """One training job, backend-neutral: what a launcher (torchrun here, a cluster's scheduler)
    runs. ``cfg`` has no ``auto`` left; ``measure``: the layout is the rule's until the probe
    (``training.probe``) has measured this config, after validation."""

    cfg: PipelineConfig
    nproc_per_node: int
    nnodes: int | str = 1  # N, or "MIN:MAX" (elastic)
    backend: str = "gloo"
    reasons: tuple[str, ...] = ()
    measure: bool = False
    given: PipelineConfig | None = None  # the config as given ("auto" kept), which a measured plan starts from

    @property
    def node_range(self) -> tuple[int, int]:
        return parse_nnodes(self.nnodes)

    @property
    def world(self) -> World:
        """The largest world this plan makes, as the manifest records it."""
        return World(nnodes=self.node_range[1], nproc_per_node=self.nproc_per_node, backend=self.backend)


def parse_nnodes(value: int | str) -> tuple[int, int]:
    """``N`` -> (N, N); ``"MIN:MAX"`` -> (MIN, MAX). Raises ConfigError unless 1 <= MIN <= MAX."""
    text = str(value).strip()
    parts = text.split(":")
    if isinstance(value, bool) or len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise ConfigError(f"--nnodes: expected N or MIN:MAX (whole numbers), got {text!r}")
    lo, hi = int(parts[0]), int(parts[-1])
    if lo < 1 or hi < lo:
        raise ConfigError(f"--nnodes: needs 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


def host_facts(cfg: PipelineConfig, home: Path, sweep: list[dict] | None = None) -> HostFacts:
    """This host's facts for ``cfg``: torch is imported only where a GPU may be, the model built
    only where an ``auto`` rule needs its size; ``sweep``: measured rows (default: the saved ones)."""
    t = cfg.training
    gpus = 0
    if t.backend != "gloo" and maybe_gpu():
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus:
        import torch

        device = torch.cuda.get_device_properties(0).total_memory
    else:
        device = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if sweep is None and t.cpu_workers == "auto":
        sweep = advisor.load_sweep(home, cfg)
    needs_size = t.strategy == "auto" or (t.cpu_workers == "auto" and not gpus and not sweep)
    return HostFacts(gpus, int(device), os.cpu_count() or 1, sweep, advisor.model_size(cfg) if needs_size else None)


def plan_launch(cfg: PipelineConfig, facts: HostFacts, nproc: int | None = None, nnodes: int | str = 1) -> LaunchPlan:
    """The plan for ``cfg`` on a host with ``facts``; ``nproc``: workers per node (default: one
    per GPU, else ``training.cpu_workers``, whose ``auto`` takes the measured best layout or, with
    nothing measured, the rule's and ``measure``). A pure function: it reads and writes nothing.
    ConfigError when the settings don't fit the world."""
    if nproc is not None and nproc < 1:
        raise ConfigError(f"--nproc: must be >= 1, got {nproc}")
    lo, hi = parse_nnodes(nnodes)
    if hi > 1 and nproc is None:
        raise ConfigError("--nnodes > 1 needs --nproc (workers per node) so every node agrees on the world size")
    given, t = cfg, cfg.training
    gpus = facts.gpus if t.backend != "gloo" else 0
    update: dict = {}
    reasons: list[str] = []
    measure = False
    if gpus:
        per_node = nproc or gpus
        if t.cpu_workers == "auto":
            update["cpu_workers"] = 1
            reasons.append(f"{gpus} GPU(s): one rank per GPU ({per_node} per node); cpu_workers is unused")
    elif t.cpu_workers != "auto":
        per_node = nproc or t.cpu_workers
    else:
        cores, rows = facts.cpu_count, advisor.valid_rows(facts.sweep or [])
        if t.strategy == "single":
            per_node, threads, why = 1, cores, f"strategy single: 1 process x {cores} threads"
        elif nproc:
            per_node, threads = nproc, max(1, cores // nproc)
            why = f"--nproc {nproc} given: {nproc} process(es) x {threads} thread(s)"
        elif rows:
            mine = [r for r in rows if r.get("batch_size") == t.batch_size]
            best = advisor.choose_layout(mine or rows)
            per_node, threads = int(best["nproc"]), int(best.get("threads") or 1)
            source = "probe" if any(r.get("source") == "probe" for r in rows) else "scale sweep"
            why = f"from the {source}: {best['reason']}"
            if not mine:
                why += f" (the sweep has no batch size {t.batch_size}; used all its rows)"
        else:
            per_node, threads, why = advisor.default_layout(cores, advisor.per_rank(facts.model, 1)["replicated_state_bytes"])
            measure = hi == 1
            if measure:
                why += "; the probe measures each layout for one epoch after validation, and the plan follows it"
        update.update(cpu_workers=per_node, threads_per_worker=threads)
        reasons.append(f"cpu_workers auto -> {per_node}, threads_per_worker -> {threads}: {why}")
    if t.strategy == "auto":
        strategy, why = advisor.choose_strategy(facts.model, facts.device_bytes, per_node * hi)
        update["strategy"] = strategy
        reasons.append(f"strategy auto -> {strategy}: {why}")
    if update:
        data = cfg.model_dump(mode="json")
        data["training"].update(update)
        cfg = config_from_dict(data)
    t = cfg.training
    if lo < hi:
        _check_elastic(cfg, lo, hi)
        if not t.checkpoints:
            reasons.append(f"--nnodes {lo}:{hi} with training.checkpoints off: after a node leaves, the others start over")
    for nodes in range(lo, hi + 1):  # every world an elastic range can make
        check_world(t.strategy, per_node * nodes, t.parallel)
    backend = t.backend if t.backend != "auto" else "nccl" if gpus else "gloo"
    return LaunchPlan(cfg, per_node, hi if lo == hi else f"{lo}:{hi}", backend, tuple(reasons), measure,
                      given if measure else None)


def _check_elastic(cfg: PipelineConfig, lo: int, hi: int) -> None:
    """torchrun must be allowed to restart an elastic job, and its layout to change world size."""
    t = cfg.training
    if t.max_restarts < 1:
        raise ConfigError(f"--nnodes {lo}:{hi}: an elastic job needs training.max_restarts >= 1 (when a node "
                          "leaves, torchrun restarts the workers of every other node: one restart per departure), "
                          f"got {t.max_restarts}")
    if t.strategy in MODEL_PARALLEL:
        raise ConfigError(f"--nnodes {lo}:{hi}: training.strategy {t.strategy!r} cannot change its world size "
                          "(its checkpoints load only into the layout that wrote them); use a fixed --nnodes N")
