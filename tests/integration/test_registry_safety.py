"""What is loaded is what was recorded, a retry never doubles a registration, and a dead promoter
never holds the promotion lease: a replaced program in the artifact store, a transient error
right after a version is created, a forged validation cache and stale lease tickets, against a
real sqlite MLflow store, real Prefect tasks and GX on the bundled digits split."""

from __future__ import annotations

import base64
import json
import logging
import pickle
import shutil
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.integration

N_FEATURES = 64


class Payload:
    """Unpickling this evaluates ``code`` (here: writes a marker file, then yields a value)."""

    def __init__(self, code: str):
        self.code = code

    def __reduce__(self):
        return eval, (self.code,)


def writes_marker(marker: Path, then: str = "None") -> bytes:
    return pickle.dumps(Payload(f"(open({str(marker)!r}, 'w').write('unpickled'), {then})[1]"))


@pytest.fixture(scope="module")
def store(mlflow_env):
    from registry.store import configure

    uri = f"sqlite:///{mlflow_env / 'mlflow.db'}"
    return {"root": mlflow_env, "uri": uri, "experiment_id": configure(uri, "integrity", mlflow_env / "artifacts")}


@pytest.fixture(scope="module")
def program(bundled_data, tmp_path_factory) -> Path:
    """A digits classifier (a linear layer fit in a few full-batch steps), exported as the worker does."""
    import pandas as pd
    import torch

    from training.export import export_model

    train = pd.read_csv(bundled_data / "train.csv")
    x = torch.tensor(train.drop(columns=["label"]).to_numpy(dtype=np.float32)) / 16
    y = torch.tensor(train["label"].to_numpy())
    torch.manual_seed(0)
    lin = torch.nn.Linear(N_FEATURES, 10)
    opt = torch.optim.Adam(lin.parameters(), lr=0.05)
    for _ in range(40):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(lin(x), y).backward()
        opt.step()

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, v):
            return self.lin(v / 16)

    folder = tmp_path_factory.mktemp("train")
    return export_model(Scaled(), N_FEATURES, folder / "model.pt2")


@pytest.fixture
def project(repo_root, bundled_data, tmp_path) -> Path:
    (tmp_path / "proj" / "configs").mkdir(parents=True)
    for name in ("digits.yaml", "digits.expectations.yaml"):
        shutil.copy(repo_root / "configs" / name, tmp_path / "proj" / "configs")
    shutil.copytree(bundled_data, tmp_path / "proj" / "data" / "digits",
                    ignore=shutil.ignore_patterns("*.dvc", ".gitignore"))
    return tmp_path / "proj"


def make_ctx(store, project: Path, model_name: str, home: Path):
    """The pipeline's RunContext for the digits config, with its own MLflow run and TRAINFLOW_HOME."""
    from core.config import load_config
    from core.manifest import DataRef, ImageRef, Manifest, World
    from flows.pipeline import RunContext
    from registry.store import start_run
    from tasks import get_task

    cfg = load_config(project / "configs" / "digits.yaml", [f"registry.model_name={model_name}"])
    manifest = Manifest("0" * 40, False, cfg.name, cfg.config_id(), DataRef("data/digits.dvc", "feed.dir", "HEAD"),
                        ImageRef(), "0" * 64, 0, World(1, 2, "gloo"))
    run_id = start_run(store["experiment_id"], "integrity", {"config_name": cfg.name})
    out = home / "runs" / run_id
    out.mkdir(parents=True)
    from training.plan import HostFacts, plan_launch

    return RunContext(cfg, get_task(cfg.task), project, home, store["uri"], run_id, manifest, out,
                      plan_launch(cfg, HostFacts(), 2))


def candidate(program: Path) -> dict:
    return {"out_dir": str(program.parent), "model_pt2": program.name, "weights_sha256": "0" * 64}


def poisoned_program(original: Path, marker: Path) -> bytes:
    """``original`` with its first weight stored as a pickle (the archive format allows it) that
    writes ``marker`` when ``torch.export.load`` unpickles it."""
    out = original.with_name("poisoned.pt2")
    with zipfile.ZipFile(original) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        names = src.namelist()
        config_name = next(n for n in names if n.endswith("data/weights/model_weights_config.json"))
        config = json.loads(src.read(config_name))
        first = next(iter(config["config"].values()))
        first["use_pickle"] = True
        weight = config_name.rsplit("/", 1)[0] + "/" + first["path_name"]
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename == config_name:
                data = json.dumps(config).encode()
            elif info.filename == weight:
                data = writes_marker(marker)
            dst.writestr(info, data)
    return out.read_bytes()


def test_a_replaced_champion_program_is_refused_before_it_is_loaded(store, project, program, tmp_path):
    """An artifact-store writer swaps the champion's model.pt2 for one whose unpickling runs code.
    Loading the champion (as evaluation and promotion do) refuses it, naming the file and both
    hashes, and the payload never runs."""
    from mlflow import MlflowClient

    from core.errors import TrainflowError
    from core.hashing import file_sha256
    from flows.pipeline import evaluate, log_version
    from registry import models

    ctx = make_ctx(store, project, "tampered-digits", tmp_path / "home")
    report = evaluate.fn(ctx, candidate(program))
    reg = log_version(ctx, candidate(program), report)
    models.promote(reg["name"], reg["version"])
    assert models.load_predictor(reg["name"]).version == reg["version"]  # loads while untouched

    stored = Path(MlflowClient().get_logged_model(reg["model_id"]).artifact_location.removeprefix("file://"))
    stored = stored / "artifacts" / "model.pt2"
    assert file_sha256(stored) == file_sha256(program)
    marker = tmp_path / "payload-ran"
    stored.write_bytes(poisoned_program(program, marker))

    error = None
    try:
        models.load_predictor(reg["name"], "champion")
    except Exception as exc:
        error = exc
    assert not marker.exists(), "the replaced program was unpickled: its payload ran"
    assert isinstance(error, TrainflowError), repr(error)
    message = str(error)
    assert "artifacts/model.pt2" in message and f"v{reg['version']}" in message
    assert file_sha256(program) in message and file_sha256(stored) in message

    # A version without the recorded hashes (registered by another tool) cannot be checked: refused too.
    for key in [k for k in MlflowClient().get_model_version(reg["name"], reg["version"]).tags if k.startswith(
            models.HASH_TAG)]:
        MlflowClient().delete_model_version_tag(reg["name"], reg["version"], key)
    with pytest.raises(TrainflowError, match=r"no sha256 of its files was recorded.*delete_registered_model_alias"):
        models.load_predictor(reg["name"], "champion")
    assert not marker.exists()


def test_every_recorded_file_of_the_champion_is_checked_before_anything_of_it_runs(store, project, program,
                                                                                  tmp_path):
    """The code files MLflow's loader imports, ``MLmodel`` (which names them) and the metadata, each
    changed in the artifact store in turn: loading the champion refuses it, naming the file, and the
    changed code never runs."""
    from mlflow import MlflowClient

    from core.errors import IntegrityError
    from registry import models

    ctx, reg = _registered_champion(store, project, program, "every-file-digits", tmp_path / "home")
    tags = MlflowClient().get_model_version(reg["name"], reg["version"]).tags
    recorded = sorted(k[len(models.HASH_TAG):] for k in tags if k.startswith(models.HASH_TAG))
    code = [rel for rel in recorded if rel.endswith(".py")]
    assert code == ["code/encoding.py", "code/pyfunc_common.py", "pyfunc_table.py"]  # the modules in code/ too
    assert {"MLmodel", "artifacts/meta.json", models.PROGRAM_FILE} <= set(recorded)
    root = Path(MlflowClient().get_logged_model(reg["model_id"]).artifact_location.removeprefix("file://"))
    marker = tmp_path / "code-ran"
    for rel in [*code, "MLmodel", "artifacts/meta.json"]:
        path = root / rel
        original = path.read_bytes()
        added = f"\nopen({str(marker)!r}, 'w').write('ran')\n" if rel.endswith(".py") else "\n"
        path.write_bytes(original + added.encode())
        try:
            with pytest.raises(IntegrityError, match=f"{rel} in the artifact store has sha256"):
                models.load_predictor(reg["name"], "champion")
        finally:
            path.write_bytes(original)
    assert not marker.exists()
    assert models.load_predictor(reg["name"], "champion").version == reg["version"]  # restored: loads again


def _registered_champion(store, project, program, name: str, home: Path) -> tuple:
    """A champion registered from a run that recorded its manifest and config as the pipeline's
    resolve does: ``(ctx, registration)``."""
    from flows.pipeline import evaluate, log_version
    from registry import models
    from registry.store import log_recorded

    ctx = make_ctx(store, project, name, home)
    log_recorded(ctx.run_id, ctx.manifest.to_dict(), "manifest.json")
    log_recorded(ctx.run_id, ctx.cfg.model_dump(mode="json"), "config.json")
    reg = log_version(ctx, candidate(program), evaluate.fn(ctx, candidate(program)))
    models.promote(reg["name"], reg["version"])
    return ctx, reg


def _run_artifact(run_id: str, name: str) -> Path:
    from mlflow import MlflowClient

    return Path(MlflowClient().get_run(run_id).info.artifact_uri.removeprefix("file://")) / name


@pytest.mark.parametrize("recorded", ["config.json", "manifest.json"])
def test_a_changed_recorded_config_or_manifest_is_refused_by_reproduce_and_retrain(store, project, program,
                                                                                    tmp_path, recorded):
    """An artifact-store writer rewrites the champion run's config.json (its ``model.factory`` is code a
    training imports) or manifest.json (the commit a reproduction checks out). ``reproduce`` refuses
    before it checks anything out or trains, and the retrain flow's read of the champion's dataset
    refuses too; each names the file and both hashes."""
    from core.errors import IntegrityError
    from core.hashing import file_sha256
    from core.paths import trainflow_home
    from flows.reproduce import ReproduceRefusedError, reproduce
    from flows.retrain import _champion_dataset
    from registry.store import load_recorded

    ctx, reg = _registered_champion(store, project, program, f"recorded-{recorded[:-5]}", tmp_path / "home")
    stored = _run_artifact(ctx.run_id, recorded)
    original = json.loads(stored.read_text())
    assert load_recorded(ctx.run_id, recorded) == original  # untouched: read back as logged
    changed = dict(original)
    if recorded == "config.json":
        changed["model"] = {**changed["model"], "factory": "evil_module:build"}
    else:
        changed["git_sha"] = "f" * 40
    stored.write_text(json.dumps(changed, indent=2, sort_keys=True))
    tampered = file_sha256(stored)

    with pytest.raises(ReproduceRefusedError) as refused:
        reproduce(f"{reg['name']}@champion", project)
    assert recorded in str(refused.value) and tampered in str(refused.value)
    assert not (trainflow_home(project) / "reproduce").exists()  # nothing checked out, nothing trained
    if recorded == "config.json":
        with pytest.raises(IntegrityError, match=f"config.json in the artifact store has sha256 {tampered}"):
            _champion_dataset(ctx.run_id, ctx.cfg.dataset)
        # A champion logged before hashes were recorded: retrain uses this config's dataset, not the file.
        from mlflow import MlflowClient

        MlflowClient().delete_tag(ctx.run_id, "trainflow.sha256/config.json")
        assert _champion_dataset(ctx.run_id, ctx.cfg.dataset) is ctx.cfg.dataset


def test_evaluation_refuses_a_tampered_champion_it_must_rescore(store, project, program, tmp_path):
    """Evaluation loads the champion when its recorded scores do not hold for this split: a program
    replaced in the artifact store since is refused there, before it is unpickled."""
    from mlflow import MlflowClient

    from core.errors import IntegrityError
    from evaluation.recorded import KEY_TAG
    from flows.pipeline import evaluate

    ctx, reg = _registered_champion(store, project, program, "rescored-digits", tmp_path / "home")
    MlflowClient().delete_model_version_tag(reg["name"], reg["version"], KEY_TAG)  # recorded scores no longer hold
    stored = Path(MlflowClient().get_logged_model(reg["model_id"]).artifact_location.removeprefix("file://"))
    marker = tmp_path / "payload-ran"
    (stored / "artifacts" / "model.pt2").write_bytes(poisoned_program(program, marker))
    with pytest.raises(IntegrityError, match="artifacts/model.pt2 in the artifact store has sha256"):
        evaluate.fn(make_ctx(store, project, "rescored-digits", tmp_path / "home2"), candidate(program))
    assert not marker.exists()


def test_a_failure_right_after_version_creation_leaves_one_version_for_the_run(prefect_api, store, project, program,
                                                                            tmp_path, monkeypatch):
    """The registry answers an error after it created the version (a dropped connection): the
    register task retries, and the MLflow run still has exactly one version, holding the aliases."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException
    from prefect import flow

    from flows.pipeline import evaluate, register

    name = "once-digits"
    ctx = make_ctx(store, project, name, tmp_path / "home")
    result = candidate(program)
    report = evaluate.fn(ctx, result)
    created = []
    real = MlflowClient.create_model_version

    def drops_the_answer_once(self, *args, **kwargs):
        version = real(self, *args, **kwargs)
        if version.name == name and not created:
            created.append(str(version.version))
            raise MlflowException("injected: connection reset after the version was created",
                                  error_code="TEMPORARILY_UNAVAILABLE")
        return version

    monkeypatch.setattr(MlflowClient, "create_model_version", drops_the_answer_once)

    @flow
    def register_once():
        return register.with_options(retry_delay_seconds=0)(ctx, result, report)

    reg = register_once()
    assert created == ["1"]  # the fault fired, after version 1 existed
    versions = MlflowClient().search_model_versions(f"name = '{name}' and run_id = '{ctx.run_id}'")
    assert sorted(str(mv.version) for mv in versions) == ["1"]
    assert reg["version"] == "1" and set(reg["aliases"]) == {"challenger", "champion"}


def test_a_tampered_validation_cache_is_never_unpickled_and_validation_runs_again(prefect_api, store, project,
                                                                                 tmp_path):
    """Whoever can write under TRAINFLOW_HOME plants a pickle that claims "validation passed" where
    the cached result is looked up: the predictable Prefect result key, and the cache's own files.
    The next validation unpickles nothing and runs GX again."""
    import prefect
    from prefect import flow

    from flows.pipeline import validate
    from validation.gx_run import data_hash, suite_key

    home = tmp_path / "home"
    ctx = make_ctx(store, project, "cached-digits", home)

    @flow
    def check():
        return validate(ctx)

    first = check()
    assert first["success"] and first["cached"] is False
    assert check()["cached"] is True  # the cache serves a second run

    marker = tmp_path / "payload-ran"
    forged = {k: v for k, v in first.items() if k != "cached"} | {"n_expectations": 999}
    payload = writes_marker(marker, f"__import__('json').loads({json.dumps(forged)!r})")
    plan = ctx.task.validation_plan(ctx.cfg, ctx.root)
    record = home / "prefect-results" / f"validate-{data_hash(plan.files)}-{suite_key(plan)}"
    meta = json.loads(record.read_text())["metadata"] if record.is_file() else {
        "storage_key": str(record), "expiration": None, "prefect_version": prefect.__version__,
        "storage_block_id": None}
    meta["serializer"] = {"type": "pickle", "picklelib": "cloudpickle"}
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"metadata": meta, "result": base64.b64encode(payload).decode()}))
    for cached in (home / "validation").glob("*.json"):
        cached.write_bytes(payload)

    third = check()
    assert not marker.exists(), "a planted validation cache was unpickled: its payload ran"
    assert third["cached"] is False and third["n_expectations"] == first["n_expectations"] != 999
    assert third["success"]


def test_a_dead_or_expired_holder_frees_the_lease_and_a_live_one_elsewhere_keeps_it(store, caplog):
    """Tickets in a real sqlite registry: one whose process on this host is gone and one whose lease
    lapsed are removed by the next promoter at once; one from another host that is still renewed
    makes it wait, then fail naming that holder."""
    from core.locks import LockTimeoutError
    from registry.lease import TICKET_SOURCE, hold, host_id, lock_name
    from registry.store import client

    c, name = client(), lock_name("lease-digits")
    with hold("lease-digits"):
        pass
    later = f"{time.time() + 600:.3f}"
    never_a_pid = str(int(open("/proc/sys/kernel/pid_max").read()) + 1)
    c.create_model_version(name, TICKET_SOURCE, tags={"holder": "killed", "host_id": host_id(), "pid": never_a_pid,
                                                      "expires": later})
    c.create_model_version(name, TICKET_SOURCE, tags={"holder": "gone", "host_id": "elsewhere", "pid": "1",
                                                      "expires": f"{time.time() - 1:.3f}"})
    # No time to wait at all: the promoter's first look at the queue removes both and finds its turn.
    with caplog.at_level(logging.WARNING, logger="registry.lease"):
        with hold("lease-digits", timeout_s=0):
            pass
    removed = [r.getMessage() for r in caplog.records if "removed ticket" in r.getMessage()]
    assert len(removed) == 2 and any(" of killed: " in m for m in removed) and any(" of gone: " in m for m in removed), removed
    assert list(c.search_model_versions(f"name = '{name}'")) == []

    live = c.create_model_version(name, TICKET_SOURCE, tags={"holder": "host-b pid 7", "host_id": "host-b",
                                                             "pid": "7", "expires": later, "note": "TRAINFLOW_HOME /b"})
    with pytest.raises(LockTimeoutError, match=r"host-b pid 7 \(TRAINFLOW_HOME /b\)"):
        with hold("lease-digits", timeout_s=1):
            pass
    assert [str(mv.version) for mv in c.search_model_versions(f"name = '{name}'")] == [str(live.version)]
