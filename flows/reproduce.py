"""``trainflow reproduce``: train a registered model again from what its run recorded, and compare.

The recorded ``manifest.json`` and ``config.json`` (sha256-checked) give the git sha, the DVC md5 and the
world size; the code is cloned at that commit and the data restored (refused when either is unavailable),
and that commit's own code trains. On CPU with the same world size the weights are bitwise equal. Nothing
is registered. A different image, package set or backend, or a dirty workspace at training time, are
warnings, not refusals.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from core.config import EXTENDS_KEY, config_id_of
from core.errors import DataUnavailableError, IntegrityError, TrainflowError
from core.manifest import flat, image_from_env, manifest_diff, packages_hash
from core.paths import tracking_uri, trainflow_home, under_home
from core.versions import SourceUnavailableError, cache_dir, checkout_commit, restore_data

EXIT_NOT_REPRODUCED = 5
EXIT_REFUSED = 6
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


class ReproduceRefusedError(TrainflowError):
    """What reproduction needs (the commit, the data version, the recorded run) is unavailable."""

    exit_code = EXIT_REFUSED


def _resolve(ref: str) -> tuple[str, object | None]:
    """(source run id, model version or None) for ``ref``."""
    from registry import models
    from registry.store import client, is_not_found

    c = client()
    if "@" in ref:
        name, alias = ref.rsplit("@", 1)
        mv = models.version_by_alias(name, alias)
        if mv is None:
            raise ReproduceRefusedError(f"{ref}: model {name!r} has no alias @{alias} in this registry")
        return mv.run_id, mv
    if "/" in ref and ref.rsplit("/", 1)[1].isdigit():
        name, version = ref.rsplit("/", 1)
        try:
            mv = c.get_model_version(name, version)
        except Exception as exc:
            if is_not_found(exc) or "not found" in str(exc).lower():
                raise ReproduceRefusedError(f"{ref}: no version {version} of model {name!r} in this registry") from None
            raise
        return mv.run_id, mv
    if not _RUN_ID.match(ref):
        raise ReproduceRefusedError(f"{ref!r} is neither NAME@ALIAS, NAME/VERSION nor an MLflow run id")
    found = c.search_model_versions(f"run_id='{ref}'")
    return ref, (found[0] if found else None)


def reproduce(ref: str, root: Path, keep: bool = False, log: Callable[[str], None] = lambda m: None) -> dict:
    """Reproduce ``ref`` in the git + DVC repository ``root``; returns the comparison summary. Raises
    ReproduceRefusedError (exit 6) when what it needs is unavailable, TrainflowError for a failed training."""
    import mlflow

    from registry import store

    t0 = time.perf_counter()
    home = trainflow_home(root)
    uri = tracking_uri(home)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    source_run, mv = _resolve(ref)
    try:  # checked against the sha256 the run recorded, before anything in them is acted on
        manifest = store.load_recorded(source_run, "manifest.json")
        config = store.load_recorded(source_run, "config.json")
    except IntegrityError as exc:
        raise ReproduceRefusedError(str(exc)) from exc
    if manifest is None or config is None:
        raise ReproduceRefusedError(f"run {source_run} has no manifest.json / config.json artifact: "
                                    "it was not recorded by the trainflow pipeline")
    if EXTENDS_KEY in config:  # an artifact store's answer must not make this host read another file
        raise ReproduceRefusedError(f"config.json of run {source_run} names another config file ({EXTENDS_KEY}: "
                                    f"{config[EXTENDS_KEY]!r}): a recorded config is the merged one and names none")
    expected = (mv.tags if mv is not None else {}).get("weights_sha256")
    if not expected:
        try:
            expected = mlflow.artifacts.load_dict(f"runs:/{source_run}/training/result.json").get("weights_sha256")
        except Exception:  # noqa: BLE001 - no such artifact: refused below
            pass
    if not expected:
        raise ReproduceRefusedError(f"run {source_run} recorded no weights_sha256 (training never finished): "
                                    "nothing to compare against")

    warnings: list[str] = []
    image, recorded_image = image_from_env(), manifest.get("image") or {}
    recorded_flat = flat(manifest)
    here = {"config_sha256": config_id_of(config), "image_ref": image.ref, "image_digest": image.digest}
    if recorded_flat.get("packages_sha256"):  # a manifest that recorded none has nothing to compare
        here["packages_sha256"] = packages_hash()
    diff = manifest_diff(recorded_flat, here, here)
    config_restored = "config_sha256" not in diff
    if not config_restored:
        warnings.append(f"config.json of run {source_run} hashes to {here['config_sha256'][:12]}, the manifest "
                        f"records {manifest['config_sha256'][:12]}")
    if manifest.get("git_dirty"):
        warnings.append(f"the model was trained from a workspace with uncommitted changes: the code at "
                        f"{manifest['git_sha'][:12]} may differ from what ran")
    if "image_ref" in diff or "image_digest" in diff:
        warnings.append(f"image differs: trained in {recorded_image.get('ref')} ({recorded_image.get('digest')}), "
                        f"reproducing in {image.ref} ({image.digest})")
    if "packages_sha256" in diff:
        warnings.append("installed packages differ from the training run's (packages_sha256)")
    world = manifest["world"]
    size = int(world["nnodes"]) * int(world["nproc_per_node"])
    if int(world["nnodes"]) > 1:
        warnings.append(f"trained on {world['nnodes']} nodes; reproducing the same world size ({size}) on this one")
    for w in warnings:
        log(f"warning: {w}")

    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    work = under_home(home, "reproduce", f"{source_run[:12]}-{stamp}-{os.getpid()}")
    src, out = work / "src", work / "out"
    try:
        checkout_commit(root, manifest["git_sha"], src)
        log(f"code: {manifest['git_sha'][:12]} checked out in {src}")
        warnings += restore_inputs(src, config, manifest, cache_dir(root))
        log(f"data: {manifest['data']['md5']} restored from the DVC cache/remote")
    except (SourceUnavailableError, DataUnavailableError) as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise ReproduceRefusedError(f"cannot reproduce {ref}: {exc}") from None

    experiment = config.get("registry", {}).get("experiment", "trainflow")
    exp_id = store.configure(uri, experiment, under_home(home, "mlartifacts"))
    model_label = f"{mv.name}/{mv.version}" if mv is not None else source_run
    recorded = {"git_sha": manifest["git_sha"], "data_md5": manifest["data"]["md5"],
                "config_sha256": manifest["config_sha256"],
                **({"pretrained_md5": manifest["pretrained"]["md5"]} if manifest.get("pretrained") else {})}
    run_id = store.start_run(exp_id, f"reproduce-{model_label.replace('/', '-v')}", {
        "trainflow.stage": "reproduce", "trainflow.reproduces": source_run, "trainflow.reproduces_model": model_label,
        **recorded})
    try:
        result = _train(src, out, config, size, run_id, uri, warnings, log)
    except BaseException:
        store.end_run(run_id, "FAILED")
        raise
    finally:
        if not keep:
            shutil.rmtree(src, ignore_errors=True)
    got = result["weights_sha256"]
    reproduced = got == expected
    summary = {
        "reproduced": reproduced, "status": "reproduced" if reproduced else "not_reproduced",
        "exit_code": 0 if reproduced else EXIT_NOT_REPRODUCED, "ref": ref,
        "model_name": getattr(mv, "name", None), "model_version": str(mv.version) if mv is not None else None,
        "source_run_id": source_run, "reproduce_run_id": run_id, "tracking_uri": uri,
        "expected_weights_sha256": expected, "weights_sha256": got, **recorded, "config_restored": config_restored,
        "world_size": result.get("world_size"), "recorded_world_size": size,
        "backend": result.get("backend"), "recorded_backend": world.get("backend"),
        "image": {"recorded": recorded_image, "current": {"ref": image.ref, "digest": image.digest}},
        "warnings": warnings, "out_dir": str(out), "checkout": str(src) if keep else None,
        "wall_s": round(time.perf_counter() - t0, 3),
    }
    store.log_json(run_id, summary, "reproduce.json")
    store.set_tags(run_id, {"reproduced": str(reproduced).lower(), "weights_sha256": got})
    store.log_metrics(run_id, {"reproduce/match": reproduced})
    store.end_run(run_id, "FINISHED")
    return summary


def restore_inputs(src: Path, config: dict, manifest: dict, cache: Path) -> list[str]:
    """Check the recorded data version, and the pretrained model folder's where the run fine-tuned one,
    out into the checkout ``src``; warnings, or DataUnavailableError naming what cannot be restored."""
    dvc_file = config.get("dataset", {}).get("dvc_file", "data/digits.dvc")
    warnings = restore_data(src, dvc_file, manifest["data"]["md5"], cache)
    recorded = manifest.get("pretrained")
    if recorded:
        section = config.get("pretrained") or {}
        folder = str(section.get("path", "")).rstrip("/")
        model_dvc = section.get("dvc_file") or f"{folder}.dvc"
        try:
            warnings += restore_data(src, model_dvc, recorded["md5"], cache)
        except DataUnavailableError as exc:
            raise DataUnavailableError(f"the pretrained model folder {folder} the run fine-tuned (md5 "
                                       f"{recorded['md5']}) cannot be restored: {exc}") from None
    return warnings


def _train(src: Path, out: Path, config: dict, size: int, run_id: str, uri: str, warnings: list[str],
           log: Callable[[str], None]) -> dict:
    """Train ``config`` with the code checked out in ``src`` (or the installed code)."""
    from training.sink import RUN_ID_ENV

    cfg_file = src / ".trainflow-reproduce" / "config.yaml"  # inside the clone: its project root
    cfg_file.parent.mkdir(parents=True, exist_ok=True)
    cfg_file.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, RUN_ID_ENV: run_id, "MLFLOW_TRACKING_URI": uri}
    if (src / "flows" / "cli.py").is_file() and (src / "training" / "worker.py").is_file():
        # The clone's packages shadow the installed ones, in this process and in torchrun's workers.
        env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])
        log(f"training with the code of the recorded commit, world size {size}")
    else:
        warnings.append("the recorded commit holds no trainflow code (a data + config repository): "
                        "trained with the installed trainflow")
        log(f"warning: {warnings[-1]}")
    cmd = [sys.executable, "-m", "flows.cli", "train", "--config", str(cfg_file), "--out", str(out),
           "--nproc", str(size)]
    timeout = float(config.get("training", {}).get("timeout_s", 900)) + 120
    out.mkdir(parents=True, exist_ok=True)
    with open(out.parent / "train.log", "w") as logf:
        proc = subprocess.run(cmd, cwd=src, env=env, stdout=logf, stderr=subprocess.STDOUT, timeout=timeout)
    result_path = out / "result.json"
    if proc.returncode != 0 or not result_path.is_file():
        tail = (out.parent / "train.log").read_text().strip().splitlines()[-5:]
        raise TrainflowError(f"reproduction training failed (exit {proc.returncode}; log {out.parent / 'train.log'}): "
                             + " | ".join(tail))
    result = json.loads(result_path.read_text())
    if result.get("status") != "completed":
        raise TrainflowError(f"reproduction training ended {result.get('status')!r}, not completed")
    return result


def print_comparison(s: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"trainflow reproduce {s['ref']}: {'REPRODUCED' if s['reproduced'] else 'NOT reproduced'}",
                  show_header=False)
    table.add_row("model", f"{s.get('model_name')} v{s.get('model_version')} (run {s['source_run_id']})")
    table.add_row("code / data", f"git {s['git_sha'][:12]}, data {s['data_md5']}")
    table.add_row("config", f"{s['config_sha256'][:12]} ({'restored exactly' if s['config_restored'] else 'MISMATCH'})")
    table.add_row("world", f"{s['world_size']} x {s['backend']} (recorded {s['recorded_world_size']} x "
                           f"{s['recorded_backend']})")
    table.add_row("weights sha256", f"recorded {s['expected_weights_sha256']}\nrerun    {s['weights_sha256']}")
    for w in s["warnings"]:
        table.add_row("warning", w)
    table.add_row("mlflow", f"run {s['reproduce_run_id']}")
    Console(stderr=True).print(table)
