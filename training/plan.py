"""The launch plan: how many nodes and workers, which strategy, how many threads, and why, decided
once by ``plan_launch`` from the config, this host's facts and the command line, with the rules
for ``auto`` below it. A launcher only formats a plan (``training.launcher.make_spec`` for torchrun
on this host); nothing else sizes the world.

Memory rules (rough, fp32): parameters 4 bytes each, gradients the same, optimizer state AdamW
2x parameters (SGD 1x), activations ``batch_size x leaf-module outputs per sample x 4`` (what
autograd keeps; slack is left to ``HEADROOM``). DDP per rank: all of it. FSDP per rank: the state
/ world + the largest layer's parameters (all-gathered while it runs) + the same activations.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from core.config import PipelineConfig, config_from_dict
from core.errors import ConfigError
from core.hashing import sha256_json
from core.manifest import World
from core.paths import project_root
from tasks import get_task
from training.layouts import MODEL_PARALLEL, check_world, layout_for, maybe_gpu

HEADROOM = 0.8
# CPU rule without a sweep: models whose replicated state is below this stay in one process.
SMALL_MODEL_BYTES = 50 * 10**6
# Two measurements closer than this (relative) count as a tie on a shared machine.
TIE_TOLERANCE = 0.02
# Training fields the sweep varies: left out of the key its results are stored under.
LAYOUT_FIELDS = ("cpu_workers", "threads_per_worker", "strategy", "batch_size", "epochs",
                 "checkpoints", "metrics", "timeout_s")


@dataclass(frozen=True)
class HostFacts:
    """What the plan needs to know of the host and the model; gathered by ``host_facts``, or given."""

    gpus: int = 0  # CUDA devices the job may use (0 with training.backend gloo)
    device_bytes: int = 0  # one device's memory: GPU 0's, else this host's RAM
    cpu_count: int = 1
    sweep: list[dict] | None = None  # rows `trainflow scale` or the probe measured for this config
    model: dict | None = None  # estimate_memory, where a rule for "auto" needs it


@dataclass(frozen=True)
class LaunchPlan:
    """One training job, backend-neutral: what a launcher (torchrun here, a cluster's scheduler)
    runs. ``cfg`` has no ``auto`` left."""

    cfg: PipelineConfig
    nproc_per_node: int
    nnodes: int | str = 1  # N, or "MIN:MAX" (elastic)
    backend: str = "gloo"
    reasons: tuple[str, ...] = ()
    # The config as given ("auto" kept) while its layout is the rule's: the probe (training.probe)
    # measures it after validation and the plan is made again from it. None: nothing to measure.
    unmeasured: PipelineConfig | None = None
    facts: HostFacts = HostFacts()  # what it was made from (the probe plans again with its rows added)

    @property
    def node_range(self) -> tuple[int, int]:
        return parse_nnodes(self.nnodes)

    @property
    def world(self) -> World:
        """The largest world this plan makes, as the manifest records it."""
        return World(nnodes=self.node_range[1], nproc_per_node=self.nproc_per_node, backend=self.backend)

    @property
    def layout(self) -> dict | None:
        """The largest world's checkpoint layout (``training.layouts.layout_for``): what its checkpoints hold."""
        t = self.cfg.training
        return layout_for(t.strategy, self.world.size, t.parallel)


def parse_nnodes(value: int | str, nproc: int | None = 1) -> tuple[int, int]:
    """``N`` -> (N, N); ``"MIN:MAX"`` -> (MIN, MAX). The command line's check: ConfigError unless
    1 <= MIN <= MAX and ``nproc`` (``--nproc``; None: not given) is >= 1, given whenever MAX > 1."""
    if nproc is not None and nproc < 1:
        raise ConfigError(f"--nproc: must be >= 1, got {nproc}")
    text = str(value).strip()
    parts = text.split(":")
    if isinstance(value, bool) or len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise ConfigError(f"--nnodes: expected N or MIN:MAX (whole numbers), got {text!r}")
    lo, hi = int(parts[0]), int(parts[-1])
    if lo < 1 or hi < lo:
        raise ConfigError(f"--nnodes: needs 1 <= MIN <= MAX, got {text!r}")
    if hi > 1 and nproc is None:
        raise ConfigError("--nnodes > 1 needs --nproc (workers per node) so every node agrees on the world size")
    return lo, hi


def host_facts(cfg: PipelineConfig, home: Path) -> HostFacts:
    """This host's facts for ``cfg``: torch is imported only where a GPU may be, the model built
    only where an ``auto`` rule needs its size; the sweep is the rows saved for ``cfg``."""
    t = cfg.training
    gpus = device = 0
    if t.backend != "gloo" and maybe_gpu():
        import torch

        if torch.cuda.is_available() and (gpus := torch.cuda.device_count()):
            device = torch.cuda.get_device_properties(0).total_memory
    device = device or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    sweep = load_sweep(home, cfg) if t.cpu_workers == "auto" else None
    needs_size = t.strategy == "auto" or (t.cpu_workers == "auto" and not gpus and not sweep)
    return HostFacts(gpus, int(device), os.cpu_count() or 1, sweep, estimate_memory(cfg) if needs_size else None)


def plan_launch(cfg: PipelineConfig, facts: HostFacts, nproc: int | None = None, nnodes: int | str = 1) -> LaunchPlan:
    """The plan for ``cfg`` on a host with ``facts``; ``nproc``: workers per node (default: one
    per GPU, else ``training.cpu_workers``, whose ``auto`` takes the measured best layout or, with
    nothing measured, the rule's, and ``unmeasured``). A pure function: it reads and writes nothing.
    ConfigError when the settings don't fit the world."""
    lo, hi = parse_nnodes(nnodes, nproc)
    t = cfg.training
    gpus = facts.gpus if t.backend != "gloo" else 0
    update, reasons, unmeasured = {}, [], None
    if gpus:
        per_node = nproc or gpus
        if t.cpu_workers == "auto":
            update["cpu_workers"] = 1
            reasons.append(f"{gpus} GPU(s): one rank per GPU ({per_node} per node); cpu_workers is unused")
    elif t.cpu_workers != "auto":
        per_node = nproc or t.cpu_workers
    else:
        cores, rows = facts.cpu_count, valid_rows(facts.sweep or [])
        if t.strategy == "single":
            per_node, threads, why = 1, cores, f"strategy single: 1 process x {cores} threads"
        elif nproc:
            per_node, threads = nproc, max(1, cores // nproc)
            why = f"--nproc {nproc} given: {nproc} process(es) x {threads} thread(s)"
        elif rows:
            mine = [r for r in rows if r.get("batch_size") == t.batch_size]
            best = choose_layout(mine or rows)
            per_node, threads = _shape(best)
            source = "probe" if any(r.get("source") == "probe" for r in rows) else "scale sweep"
            why = f"from the {source}: {best['reason']}"
            if not mine:
                why += f" (the sweep has no batch size {t.batch_size}; used all its rows)"
        else:
            per_node, threads, why = default_layout(cores, facts.model["replicated_state_bytes"])
            unmeasured = cfg if hi == 1 else None  # the config as given: nothing of it updated yet
            if unmeasured:
                why += "; the probe measures each layout for one epoch after validation, and the plan follows it"
        update.update(cpu_workers=per_node, threads_per_worker=threads)
        reasons.append(f"cpu_workers auto -> {per_node}, threads_per_worker -> {threads}: {why}")
    if t.strategy == "auto":
        strategy, why = choose_strategy(facts.model, facts.device_bytes, per_node * hi)
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
    nnodes = hi if lo == hi else f"{lo}:{hi}"
    return LaunchPlan(cfg, per_node, nnodes, backend, tuple(reasons), unmeasured, facts)


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


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def estimate_memory(cfg: PipelineConfig, world_size: int = 1) -> dict:
    """Bytes of ``cfg``'s model by kind (parameters, gradients, optimizer state, activations of one
    batch, the largest layer's parameters) and per rank when ``world_size`` ranks train it (rules in
    the module doc). Builds the model (tables read their train split)."""
    import torch

    task = get_task(cfg.task)
    info = task.info(cfg, project_root())
    model = task.build_model(cfg, info)
    out_elems = [0]  # leaf outputs per sample

    def hook(_m, _inp, out):
        if torch.is_tensor(out):
            out_elems[0] += out[0].numel()

    for name, module in model.named_modules():
        if name and not list(module.children()):
            module.register_forward_hook(hook)  # the model is thrown away after this count
    with torch.no_grad():
        model.eval()(task.example_input(cfg, info, batch=1))
    leaves = [m for m in model.modules() if not list(m.children())]
    largest = max((sum(p.numel() for p in m.parameters()) for m in leaves), default=0)
    n_params, t = sum(p.numel() for p in model.parameters()), cfg.training
    param = 4 * n_params
    mem = {"n_params": n_params, "param_bytes": param, "grad_bytes": param,
           "optim_bytes": param * (2 if t.optimizer == "adamw" else 1),
           "activation_bytes": t.batch_size * out_elems[0] * 4, "largest_layer_param_bytes": 4 * largest,
           "optimizer": t.optimizer, "batch_size": t.batch_size}
    return {**mem, **_per_rank(mem, world_size)}


def _per_rank(mem: dict, world_size: int) -> dict:
    state = mem["param_bytes"] + mem["grad_bytes"] + mem["optim_bytes"]
    sharded = math.ceil(state / world_size) + (mem["largest_layer_param_bytes"] if world_size > 1 else 0)
    return {"world_size": world_size, "replicated_state_bytes": state,
            "ddp_total_bytes": state + mem["activation_bytes"],
            "fsdp_state_bytes": sharded, "fsdp_total_bytes": sharded + mem["activation_bytes"]}


def choose_strategy(mem: dict, device_bytes: int, world_size: int) -> tuple[str, str]:
    """(strategy, reason): ``single`` for one rank, ``ddp`` when a replica fits in
    ``HEADROOM x device_bytes``, ``fsdp`` when only the sharded state fits; else ConfigError."""
    sizes = _per_rank(mem, world_size)
    budget = HEADROOM * device_bytes
    ddp, fsdp = sizes["ddp_total_bytes"], sizes["fsdp_total_bytes"]
    where = f"{HEADROOM:.0%} of {human_bytes(device_bytes)} per device = {human_bytes(budget)}"
    if world_size == 1:
        if ddp <= budget:
            return "single", f"one rank: single process; the model needs {human_bytes(ddp)}, within {where}"
        raise ConfigError(
            f"training.strategy: auto: the model needs {human_bytes(ddp)} per rank "
            f"(params {human_bytes(mem['param_bytes'])}, grads {human_bytes(mem['grad_bytes'])}, "
            f"optimizer {human_bytes(mem['optim_bytes'])}, activations {human_bytes(mem['activation_bytes'])}) "
            f"but one device has {where}; use more devices (fsdp) or a smaller model/batch")
    if ddp <= budget:
        return "ddp", f"{world_size} ranks: ddp; a full replica needs {human_bytes(ddp)} per rank, within {where}"
    if fsdp <= budget:
        return "fsdp", (f"{world_size} ranks: fsdp; a replica needs {human_bytes(ddp)} per rank, over "
                        f"{where}, sharded it needs {human_bytes(fsdp)}")
    raise ConfigError(
        f"training.strategy: auto: nothing fits: a replica needs {human_bytes(ddp)} per rank (ddp) and "
        f"the sharded state {human_bytes(fsdp)} per rank (fsdp over {world_size} ranks), but the budget "
        f"is {where}; use more devices or a smaller model/batch")


def _shape(row: dict) -> tuple[int, int]:
    """(processes, threads per process) of a sweep row."""
    return int(row["nproc"]), int(row.get("threads") or 1)


def describe(row: dict, with_batch: bool = False) -> str:
    """``1 process x 2 threads`` / ``2 DDP processes x 1 thread`` (/ ``2 GPUs``)."""
    n, t = _shape(row)
    if row.get("device") == "cuda":
        text = f"{n} GPU" + ("s" if n > 1 else "")
    else:
        text = ("1 process" if n == 1 else f"{n} DDP processes") + f" x {t} thread" + ("s" if t > 1 else "")
    return text + (f", batch {row['batch_size']}" if with_batch else "")


def valid_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("samples_per_s")]


def _speedup(best: dict, other: dict, metric: str) -> float | None:
    """How many times better ``best`` is than ``other`` on ``metric`` (None: other has no value)."""
    if metric == "samples_per_s":
        return best[metric] / max(other[metric], 1e-9)
    return None if other.get(metric) is None else other[metric] / max(best[metric], 1e-9)


def choose_layout(measurements: list[dict]) -> dict:
    """The best sweep row plus ``metric`` and ``reason``: the fastest time-to-target when any row
    reached the target (rows that did not are out), else the highest samples/s. Rows within
    TIE_TOLERANCE of the best tie and go to the fewest processes (then the fewest threads)."""
    rows = valid_rows(measurements)
    if not rows:
        raise ValueError("choose_layout: no measurement has samples_per_s (did every layout fail?)")
    to_target = any(r.get("time_to_target_s") is not None for r in rows)
    if to_target:
        metric, sign, what = "time_to_target_s", 1, "reached the target in {:.2f} s of training"
        rows = [r for r in rows if r.get(metric) is not None]
        best_value = min(r[metric] for r in rows)
        close = [r for r in rows if r[metric] <= best_value * (1 + TIE_TOLERANCE)]
    else:
        metric, sign, what = "samples_per_s", -1, "trained at {:,.0f} samples/s (no layout reached the target accuracy)"
        best_value = max(r[metric] for r in rows)
        close = [r for r in rows if r[metric] >= best_value * (1 - TIE_TOLERANCE)]
    best = min(close, key=lambda r: (*_shape(r), sign * r[metric]))
    with_batch = len({r.get("batch_size") for r in measurements}) > 1
    reason = f"{describe(best, with_batch)} {what.format(best[metric])}"
    if len(close) > 1:
        reason += (f"; tied within {TIE_TOLERANCE:.0%} with "
                   + ", ".join(describe(r, with_batch) for r in close if r is not best)
                   + ", so the one with fewer processes wins")
    return {**best, "metric": metric, "reason": reason}


def recommendation(measurements: list[dict]) -> str:
    """Plain words: which layout to use, how much faster it is than the one with the most
    processes (or the runner-up), and, explicitly, when fewer workers win."""
    rows = valid_rows(measurements)
    if not rows:
        return "No layout produced a measurement; nothing to recommend."
    best = choose_layout(rows)
    metric = best["metric"]
    with_batch = len({r.get("batch_size") for r in rows}) > 1
    name = describe(best, with_batch)
    most = max(int(r["nproc"]) for r in rows)
    others = [r for r in rows if any(r.get(k) != best.get(k) for k in ("nproc", "threads", "batch_size"))]
    if not others:
        return f"{name} is the only layout measured: use it."
    fewer = int(best["nproc"]) < most
    # With fewer processes, the strongest layout with the most processes is the comparison that matters.
    contenders = [r for r in others if int(r["nproc"]) == most] if fewer else others
    scored = [(s, r) for r in contenders if (s := _speedup(best, r, metric)) is not None]
    if scored:
        factor, other = min(scored, key=lambda x: x[0])
        basis = "time to target accuracy" if metric == "time_to_target_s" else "samples/s"
        text = f"{name} is {factor:.1f}x faster ({basis}) than {describe(other, with_batch)} for this model: use it."
    else:
        other = contenders[0]
        text = f"{name} reached the target accuracy and {describe(other, with_batch)} did not: use it."
    if fewer:
        text += (" Fewer workers win here: adding processes costs more in communication and "
                 "per-process overhead than it gains for this model.")
    elif math.prod(_shape(best)) < math.prod(_shape(other)):
        text += (" Fewer threads win here: intra-op threads wait on each other more than they help "
                 "for this model (worse on a busy, shared machine).")
    elif int(best["nproc"]) > 1:
        text += " More processes pay off for this model."
    return text


def default_layout(cpu_count: int, replicated_bytes: int) -> tuple[int, int, str]:
    """(processes, threads per process, reason) on CPU when no sweep exists: a model whose
    replicated state is below ``SMALL_MODEL_BYTES`` gets 1 process x all cores (DDP on a few CPU
    cores loses to one process's intra-op threads); bigger ones 2 DDP processes to start with."""
    cores = max(1, int(cpu_count))
    state, small = human_bytes(replicated_bytes), human_bytes(SMALL_MODEL_BYTES)
    if replicated_bytes < SMALL_MODEL_BYTES or cores < 2:
        return 1, cores, (f"no sweep: the model's replicated state is {state} "
                          f"(< {small}): small models stay in one process, "
                          f"1 process x {cores} thread{'s' if cores > 1 else ''}")
    return 2, cores // 2, (f"no sweep: the model's replicated state is {state} (>= {small}): "
                           f"2 DDP processes x {cores // 2} threads; run `trainflow scale` to measure")


def layout_key(cfg: PipelineConfig) -> str:
    """12 hex digits identifying everything but the layout: a sweep over layouts of one
    config and the same config with ``cpu_workers: auto`` share it."""
    data = cfg.model_dump(mode="json")
    for name in LAYOUT_FIELDS:
        data["training"].pop(name, None)
    return sha256_json(data)[:12]


def sweep_path(home: Path, cfg: PipelineConfig) -> Path:
    return Path(home) / "scale" / f"{layout_key(cfg)}.json"


def save_sweep(home: Path, cfg: PipelineConfig, rows: list[dict], **about) -> Path:
    """Keep ``rows`` measured for ``cfg`` (any layout) where ``load_sweep`` finds them."""
    path = sweep_path(home, cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**about, "rows": rows}, indent=2))
    return path


def load_sweep(home: Path, cfg: PipelineConfig) -> list[dict] | None:
    """Rows ``trainflow scale`` saved for this config (any layout), or None."""
    try:
        data = json.loads(sweep_path(home, cfg).read_text())
    except (OSError, ValueError):
        return None
    rows = data.get("rows") if isinstance(data, dict) else data
    return rows if isinstance(rows, list) and rows else None
