"""A job over several agents (nodes): do they share the output folder, and does every node learn the outcome?

c10d hands out global ranks by arrival, so which node's ``--out`` rank 0 writes into is known only
once the job runs: resuming needs one folder every node sees, and a node that does not see rank
0's folder gets a copy of the result. A single node skips both.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from pathlib import Path
from typing import NamedTuple

from core.errors import ConfigError
from training import distributed as dist_util
from training.launcher import NNODES_ENV, parse_nnodes

log = logging.getLogger("trainflow.multinode")

# Rank 0's nonce in its --out: a rank that reads the same value in its own --out shares the folder.
NONCE_FILE = ".trainflow-rank0-nonce"


def several_nodes() -> bool:
    """More than one torchrun agent in this world (torchrun's ``GROUP_WORLD_SIZE``)."""
    return int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1


def elastic() -> bool:
    """The job was started with a node range (``--nnodes MIN:MAX``, MIN < MAX)."""
    lo, hi = parse_nnodes(os.environ.get(NNODES_ENV, "1"))
    return lo < hi


def max_restarts(cfg) -> int:
    """torchrun's restart budget for this job (what it told the workers; the config's outside torchrun)."""
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", cfg.training.max_restarts))


def needs_shared_out(cfg) -> bool:
    """Every rank must read rank 0's checkpoints: checkpoints on, and torchrun may restart the
    workers (``training.max_restarts`` > 0, or an elastic range, whose joins restart them)."""
    return bool(cfg.training.checkpoints) and (max_restarts(cfg) > 0 or elastic())


class OutView(NamedTuple):
    mine: bool  # this rank's --out is rank 0's folder
    everyone: bool


def check_shared_out(ctx, out: Path, cfg) -> OutView:
    """COLLECTIVE (several nodes only): does this rank, and does every rank, see rank 0's ``out``?
    Raises ConfigError on every rank when some rank does not and resuming needs it."""
    if not ctx.distributed or not several_nodes():
        return OutView(True, True)
    nonce = None
    if ctx.is_main:
        nonce = secrets.token_hex(16)
        tmp = out / f"{NONCE_FILE}.tmp"
        tmp.write_text(nonce)
        tmp.replace(out / NONCE_FILE)
    nonce = dist_util.broadcast_object(ctx, nonce)  # also orders rank 0's write before every read
    try:
        seen = (out / NONCE_FILE).read_text() == nonce
    except OSError:
        seen = False
    views = dist_util.all_gather_object(ctx, (seen, socket.gethostname(), str(out)))
    blind = sorted({f"{host}:{path}" for ok, host, path in views if not ok})
    if not blind:
        return OutView(True, True)
    _, host0, out0 = views[0]
    where = f"rank 0 writes into {host0}:{out0}, which is not the --out of {', '.join(blind)}"
    if needs_shared_out(cfg):
        why = "an elastic --nnodes range" if elastic() else f"training.max_restarts={max_restarts(cfg)}"
        raise ConfigError(
            f"--out is not storage every node shares: {where}. Resuming after a restart ({why}) reads rank 0's "
            "checkpoints from every node's --out, and c10d may give rank 0 to any node: give every node the "
            "same shared folder (NFS, a ReadWriteMany volume), or train without restarts "
            "(training.max_restarts=0 and a fixed --nnodes) or without checkpoints (training.checkpoints=false)")
    if ctx.is_main:
        log.info("--out is not shared: %s; each of those nodes gets a copy of the result, the weights stay here",
                 where)
    return OutView(seen, False)


def share_outcome(ctx, result: dict | None, out: Path, view: OutView) -> dict | None:
    """COLLECTIVE (several nodes only): rank 0's ``result``, with where it lives, on every rank."""
    if not ctx.distributed or not several_nodes():
        return result
    if ctx.is_main:
        result = {**result, "nodes": int(os.environ["GROUP_WORLD_SIZE"]), "shared_out": view.everyone,
                  "rank0": {"host": socket.gethostname(), "out_dir": str(out)}}
    return dist_util.broadcast_object(ctx, result)


class PeerPreempted(RuntimeError):
    """This node's workers checkpointed for another node's preemption; torchrun restarts them without it."""


def carry_on_if_peer_preempted(status: str, signalled: bool, step: int) -> None:
    """In an elastic job, raise ``PeerPreempted`` when this rank stopped for another node's SIGTERM
    (after the results are written): torchrun restarts it into the smaller world, which resumes."""
    if status == "preempted" and not signalled and elastic() and several_nodes():
        raise PeerPreempted(f"another node was preempted at step {step} (checkpoint saved): "
                            "restarting to re-form the world without it")


def node_copy(result: dict) -> dict:
    """The ``result.json`` of a node that does not see rank 0's folder: the outcome, marked as a
    copy, without the weight files (they are in ``rank0.out_dir`` on ``rank0.host``)."""
    return {**{k: v for k, v in result.items() if k not in ("weights", "model_pt2")},
            "node_copy": {"host": socket.gethostname(), "group_rank": int(os.environ.get("GROUP_RANK", "0"))}}
